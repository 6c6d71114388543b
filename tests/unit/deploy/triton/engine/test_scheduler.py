"""The torch engine in-process on the tiny model: greedy parity, in-flight batching, controls."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from deploy.triton.engine.scheduler import Engine
from deploy.triton.engine.types import (
    EngineConfig,
    EngineError,
    EngineFinishReason,
    SamplingConfig,
    SequenceOutput,
)
from tests.support.engine import (
    MAX_SEQ_LEN,
    SAMPLED,
    TIMEOUT_S,
    Result,
    fresh_index,
    make,
    reference,
    run,
    submit,
)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    config = EngineConfig(str(tiny_model_dir), max_batch_size=8, max_seq_len=MAX_SEQ_LEN)
    engine = Engine.from_config(config)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def prompts(tiny_model_dir: Path) -> list[tuple[int, ...]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = ["The quick brown fox", "def add(a, b):", "paris", "a b c d e f g h i j k l m n"]
    return [tuple(tokenizer.encode(text)) for text in texts]


@pytest.mark.parametrize("streaming", [False, True])
def test_greedy_matches_transformers_generate(
    engine: Engine, hf_model: Any, prompts: list[tuple[int, ...]], streaming: bool
) -> None:
    for prompt in prompts:
        result = run(engine, make(prompt, streaming=streaming))
        assert result.tokens() == reference(hf_model, prompt)


def test_concurrent_requests_decode_exactly_as_alone(
    engine: Engine, hf_model: Any, prompts: list[tuple[int, ...]]
) -> None:
    lengths = [24, 9, 17, 30]
    steps_before = engine.stats().steps
    results = [submit(engine, make(p, n)) for p, n in zip(prompts, lengths, strict=True)]
    for result, prompt, n in zip(results, prompts, lengths, strict=True):
        assert result.wait().tokens() == reference(hf_model, prompt, n)
    assert engine.stats().steps - steps_before < sum(lengths) / 2


def test_requests_join_and_leave_a_running_batch(
    engine: Engine, hf_model: Any, prompts: list[tuple[int, ...]]
) -> None:
    late: list[Result] = []

    class JoinAfterThree(Result):
        def __call__(self, output: SequenceOutput) -> None:
            super().__call__(output)
            if len(self.tokens()) == 3 and not late:
                late.append(submit(engine, make(prompts[1], 20, streaming=True)))

    first = JoinAfterThree(1)
    engine.submit(make(prompts[0], 40, streaming=True), first)
    short = run(engine, make(prompts[2], 5))
    assert first.wait().tokens() == reference(hf_model, prompts[0], 40)
    assert late[0].wait().tokens() == reference(hf_model, prompts[1], 20)
    assert short.tokens() == reference(hf_model, prompts[2], 5)


def test_requests_beyond_the_batch_size_wait_their_turn(
    engine: Engine, hf_model: Any, prompts: list[tuple[int, ...]]
) -> None:
    requests = [make(prompts[i % len(prompts)], 6 + i) for i in range(engine.max_batch_size + 5)]
    results = [submit(engine, request) for request in requests]
    for result, request in zip(results, requests, strict=True):
        expected = reference(hf_model, request.input_ids, request.max_new_tokens)
        assert result.wait().tokens() == expected


def test_streaming_sends_one_token_per_output_and_an_empty_final_on_end_id(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    full = run(engine, make(prompts[0], end_ids=())).tokens()
    stop_at = fresh_index(full, 3)
    result = run(engine, make(prompts[0], end_ids=(full[stop_at],), streaming=True))
    assert [o.token_ids.tolist() for o in result.outputs[:-1]] == [[t] for t in full[:stop_at]]
    last = result.outputs[-1]
    assert last.finish_reason is EngineFinishReason.END_ID
    assert last.token_ids.size == 0
    assert [o.finished for o in result.outputs].count(True) == 1


def test_non_streaming_sends_everything_once(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    result = run(engine, make(prompts[1], 7, end_ids=()))
    assert len(result.outputs) == 1
    assert result.final().finish_reason is EngineFinishReason.LENGTH
    assert len(result.tokens()) == 7


def test_stop_words_end_generation_and_stay_in_the_output(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    full = run(engine, make(prompts[0], end_ids=())).tokens()
    at = fresh_index(full, 3)
    word = (full[at - 1], full[at])
    result = run(
        engine, make(prompts[0], end_ids=(), stop_words=((full[0], full[0], full[0]), word))
    )
    assert result.tokens() == full[: at + 1]
    assert result.final().finish_reason is EngineFinishReason.STOP_WORDS


def test_bad_words_are_never_generated(engine: Engine, prompts: list[tuple[int, ...]]) -> None:
    full = run(engine, make(prompts[0], end_ids=())).tokens()
    single = run(engine, make(prompts[0], end_ids=(), bad_words=((full[0],),))).tokens()
    assert full[0] not in single
    pair = run(engine, make(prompts[0], end_ids=(), bad_words=((full[0], full[1]),))).tokens()
    assert pair[0] == full[0]
    assert pair[1] != full[1]


def test_min_tokens_holds_back_the_end_id(engine: Engine, prompts: list[tuple[int, ...]]) -> None:
    full = run(engine, make(prompts[0], end_ids=())).tokens()
    at = fresh_index(full, 2)
    ends_early = run(engine, make(prompts[0], end_ids=(full[at],))).tokens()
    assert ends_early == full[:at]
    params = SamplingConfig(temperature=0.0, min_tokens=at + 4)
    held = run(engine, make(prompts[0], end_ids=(full[at],), sampling=params)).tokens()
    assert len(held) >= at + 4
    assert full[at] not in held[: at + 4]


def test_output_never_exceeds_the_sequence_limit(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    prompt = (prompts[3] * 40)[: MAX_SEQ_LEN - 5]
    result = run(engine, make(prompt, 50, end_ids=()))
    assert len(result.tokens()) == 5
    assert result.final().finish_reason is EngineFinishReason.LENGTH
    with pytest.raises(EngineError, match="torch_max_seq_len"):
        engine.submit(make((prompts[3] * 40)[:MAX_SEQ_LEN]), Result(1))


def test_seeded_sampling_is_reproducible_alone_and_batched(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    prompt = prompts[0]
    alone = run(engine, make(prompt, 30, sampling=SAMPLED, end_ids=())).tokens()
    again = run(engine, make(prompt, 30, sampling=SAMPLED, end_ids=())).tokens()
    batched = [submit(engine, make(p, 30, sampling=SAMPLED, end_ids=())) for p in prompts]
    assert alone == again == batched[0].wait().tokens()
    reseeded = dataclasses.replace(SAMPLED, seed=43)
    assert run(engine, make(prompt, 30, sampling=reseeded, end_ids=())).tokens() != alone
    greedy = run(engine, make(prompt, 30, end_ids=())).tokens()
    assert alone != greedy


def test_num_return_sequences_are_independent_samples_of_one_prompt(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    request = make(prompts[0], 30, sampling=SAMPLED, end_ids=(), num_return_sequences=3)
    result = run(engine, request)
    samples = [result.tokens(i) for i in range(3)]
    assert len({tuple(s) for s in samples}) == 3
    single = run(engine, make(prompts[0], 30, sampling=SAMPLED, end_ids=())).tokens()
    assert samples[0] == single
    again = run(engine, dataclasses.replace(request, request_id=f"{request.request_id}-again"))
    assert again.tokens(2) == samples[2]


def test_top_k_one_is_greedy_at_any_temperature(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    params = SamplingConfig(temperature=1.7, top_k=1, seed=3, min_tokens=0)
    assert (
        run(engine, make(prompts[1], sampling=params)).tokens()
        == run(engine, make(prompts[1])).tokens()
    )


@pytest.mark.parametrize(
    "params",
    [
        SamplingConfig(temperature=0.0, presence_penalty=1e6),
        SamplingConfig(temperature=0.0, frequency_penalty=1e6),
    ],
)
def test_penalties_stop_tokens_from_repeating(
    engine: Engine, prompts: list[tuple[int, ...]], params: SamplingConfig
) -> None:
    plain = run(engine, make(prompts[3], 60, end_ids=())).tokens()
    assert len(set(plain)) < len(plain)
    penalised = run(engine, make(prompts[3], 60, end_ids=(), sampling=params)).tokens()
    assert len(set(penalised)) == len(penalised)


def test_repetition_penalty_covers_the_prompt(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    params = SamplingConfig(temperature=0.0, repetition_penalty=1e6)
    prompt = prompts[3]
    tokens = run(engine, make(prompt, 20, end_ids=(), sampling=params)).tokens()
    history = list(prompt)
    for token in tokens:
        assert token not in history
        history.append(token)


def test_embedding_bias_shifts_the_choice(engine: Engine, prompts: list[tuple[int, ...]]) -> None:
    full = run(engine, make(prompts[0], 6, end_ids=())).tokens()
    bias = np.zeros(engine.runner.vocab_size, np.float32)
    bias[full[1]] = 1e4
    assert (
        run(engine, make(prompts[0], 6, end_ids=(), embedding_bias=bias)).tokens() == [full[1]] * 6
    )


def test_log_probs_are_the_models(
    engine: Engine, hf_model: Any, prompts: list[tuple[int, ...]]
) -> None:
    prompt = prompts[1]
    result = run(engine, make(prompt, 8, end_ids=(), return_log_probs=True))
    tokens = result.tokens()
    with torch.no_grad():
        logits = hf_model(torch.tensor([[*prompt, *tokens]])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    expected = expected.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)
    final = result.final()
    assert final.log_probs is not None
    assert final.log_probs.tolist() == pytest.approx(expected.tolist(), abs=1e-4)
    assert final.cum_log_prob == pytest.approx(float(expected.sum()), abs=1e-3)


@pytest.mark.parametrize("streaming", [False, True])
def test_stop_ends_a_request_and_frees_its_slot(
    engine: Engine, prompts: list[tuple[int, ...]], streaming: bool
) -> None:
    started = threading.Event()

    class Watch(Result):
        def __call__(self, output: SequenceOutput) -> None:
            super().__call__(output)
            started.set()

    result = Watch(2)
    request = make(prompts[0], MAX_SEQ_LEN, end_ids=(), streaming=streaming, num_return_sequences=2)
    engine.submit(request, result)
    if streaming:
        assert started.wait(TIMEOUT_S)
    engine.stop(request.request_id)
    result.wait()
    for index in (0, 1):
        assert result.final(index).finish_reason is EngineFinishReason.CANCELLED
        assert len(result.tokens(index)) < MAX_SEQ_LEN - len(prompts[0])
    assert run(engine, make(prompts[2], 3)).tokens()
    assert engine.stats().running_sequences == 0
    assert engine.stats().waiting_requests == 0


def test_running_request_ids_are_unique(engine: Engine, prompts: list[tuple[int, ...]]) -> None:
    request = make(prompts[0], 200, end_ids=())
    first = submit(engine, request)
    with pytest.raises(EngineError, match="already running"):
        engine.submit(request, Result(1))
    engine.stop(request.request_id)
    first.wait()


def test_shutdown_ends_every_request_with_a_final_output(tiny_model_dir: Path) -> None:
    engine = Engine.from_config(EngineConfig(str(tiny_model_dir), max_batch_size=1))
    running = submit(engine, make((5, 6, 7), 4000, end_ids=(), streaming=True))
    waiting = submit(engine, make((5, 6), 10))
    deadline = time.monotonic() + TIMEOUT_S
    while not running.outputs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert running.outputs
    engine.shutdown()
    assert running.wait().final().finish_reason is EngineFinishReason.CANCELLED
    assert waiting.wait().final().finish_reason is EngineFinishReason.CANCELLED
    with pytest.raises(EngineError, match="shut down"):
        engine.submit(make((5,)), Result(1))
