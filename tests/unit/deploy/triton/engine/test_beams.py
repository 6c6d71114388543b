"""Beam search in the torch engine: transformers' beams on the tiny model, TensorRT-LLM's rules
where the two differ, beams beside sampled rows, streaming, stops and the KV blocks."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from deploy.triton.engine.beams import (
    BeamCandidate,
    Finished,
    Hypothesis,
    candidates,
    choose,
    is_done,
    normalised,
)
from deploy.triton.engine.scheduler import Engine
from deploy.triton.engine.types import (
    EngineBeamSearch,
    EngineConfig,
    EngineError,
    EngineFinishReason,
    GuideRequest,
    KvCacheConfig,
)
from tests.support.engine import MAX_SEQ_LEN, SAMPLED, beam_reference, make, run, submit

_EARLY = {True: 1, False: 0, "never": 2}


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    config = EngineConfig(
        str(tiny_model_dir),
        max_batch_size=8,
        max_seq_len=MAX_SEQ_LEN,
        max_beam_width=4,
        kv_cache=KvCacheConfig(tokens_per_block=4),
    )
    engine = Engine.from_config(config)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def prompts(tiny_model_dir: Path) -> list[tuple[int, ...]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = ["The quick brown fox", "def add(a, b):", "a b c d e f g h i j k l m n"]
    return [tuple(tokenizer.encode(text)) for text in texts]


@pytest.mark.parametrize(
    ("width", "max_new", "penalty", "early", "eos"),
    [
        (2, 12, 1.0, True, 12),
        (3, 16, 0.0, True, 19),
        (4, 20, 1.0, False, 437),
        (3, 10, 2.0, "never", 12),
        (4, 24, 0.5, True, 602),
        (3, 20, -1.0, False, 19),
        (4, 20, 0.0, "never", 2),
    ],
)
def test_beams_match_transformers_generate(
    engine: Engine,
    hf_model: Any,
    prompts: list[tuple[int, ...]],
    width: int,
    max_new: int,
    penalty: float,
    early: Any,
    eos: int,
) -> None:
    """The end ids are tokens the tiny model emits, so that beams end before the limit."""
    for prompt in prompts:
        beam = EngineBeamSearch(width, length_penalty=penalty, early_stopping=_EARLY[early])
        final = run(engine, make(prompt, max_new, beam=beam, end_ids=(eos,))).final()
        assert final.beams is not None
        ours = [tokens.tolist() for tokens in final.beams.token_ids]
        expected = beam_reference(
            hf_model, prompt, width, max_new, length_penalty=penalty, early_stopping=early, eos=eos
        )
        assert ours == expected


def test_beams_end_on_the_end_id_and_report_their_log_probs(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    request = make(prompts[0], 20, beam=EngineBeamSearch(4), end_ids=(12,), return_log_probs=True)
    result = run(engine, request)
    assert len(result.outputs) == 1
    beams = result.final().beams
    assert beams is not None
    assert len(beams.token_ids) == 4
    assert any(len(tokens) < 20 for tokens in beams.token_ids)
    for tokens, log_probs, cum in zip(
        beams.token_ids, beams.log_probs, beams.cum_log_probs, strict=True
    ):
        assert 12 not in tokens.tolist()
        assert len(log_probs) == len(tokens)
        # An ended beam's sum also holds its end token's log prob, as in TensorRT-LLM.
        assert cum <= float(log_probs.sum()) + 1e-4
    assert list(beams.cum_log_probs) == sorted(beams.cum_log_probs, reverse=True)


def test_streaming_sends_every_beam_so_far_then_the_result(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    request = make(prompts[1], 8, beam=EngineBeamSearch(3))
    whole = run(engine, request).final()
    streamed = run(engine, dataclasses.replace(request, request_id="s", streaming=True))
    assert len(streamed.outputs) == 8
    for step, output in enumerate(streamed.outputs, start=1):
        assert output.beams is not None and output.sequence_index == 0
        assert [len(tokens) for tokens in output.beams.token_ids] == [step] * 3
    last = streamed.outputs[-1]
    assert last.finished and last.beams is not None and whole.beams is not None
    assert [t.tolist() for t in last.beams.token_ids] == [t.tolist() for t in whole.beams.token_ids]


def test_sampled_rows_decode_exactly_as_without_a_beam_search_beside_them(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    prompt = prompts[0]
    greedy_alone = run(engine, make(prompt, 20)).tokens()
    sampled_alone = run(engine, make(prompt, 20, sampling=SAMPLED)).tokens()
    beams = submit(engine, make(prompts[2], 40, beam=EngineBeamSearch(4)))
    greedy = submit(engine, make(prompt, 20))
    sampled = submit(engine, make(prompt, 20, sampling=SAMPLED))
    assert greedy.wait().tokens() == greedy_alone
    assert sampled.wait().tokens() == sampled_alone
    assert beams.wait().final().finish_reason is EngineFinishReason.LENGTH
    assert engine.stats().max_running >= 5


def test_kv_blocks_add_up_while_beams_fork_and_all_return(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    """Blocks of 4 tokens: beams fork partial blocks at almost every step."""
    pending = [submit(engine, make(p, 30, beam=EngineBeamSearch(4))) for p in prompts[:2]]
    seen_used = 0
    while not all(result.done.is_set() for result in pending):
        kv = engine.stats().kv_cache
        assert kv is not None and kv.free_blocks + kv.used_blocks == kv.max_blocks
        seen_used = max(seen_used, kv.used_blocks)
        time.sleep(0.002)
    for result in pending:
        result.wait()
    kv = engine.stats().kv_cache
    assert kv is not None and kv.used_blocks == 0 and kv.free_blocks == kv.max_blocks
    assert seen_used > 0


def test_a_stopped_beam_search_answers_once_with_its_beams_and_frees_its_blocks(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    request = make(prompts[0], 200, beam=EngineBeamSearch(3), streaming=True)
    result = submit(engine, request)
    while len(result.outputs) < 3:
        time.sleep(0.005)
    engine.stop(request.request_id)
    final = result.wait().final()
    assert final.finish_reason is EngineFinishReason.CANCELLED
    assert final.beams is not None and len(final.beams.token_ids) == 3
    assert sum(output.finished for output in result.outputs) == 1
    time.sleep(0.05)
    kv = engine.stats().kv_cache
    assert kv is not None and kv.used_blocks == 0


def test_stop_words_end_a_beam_with_the_word_in_it(
    engine: Engine, prompts: list[tuple[int, ...]]
) -> None:
    free = run(engine, make(prompts[0], 12, beam=EngineBeamSearch(3))).final()
    assert free.beams is not None
    word = (int(free.beams.token_ids[0][3]),)
    asked = make(prompts[0], 12, beam=EngineBeamSearch(3), stop_words=(word,))
    stopped = run(engine, asked).final()
    assert stopped.beams is not None
    for tokens in stopped.beams.token_ids:
        ids = tokens.tolist()
        assert word[0] not in ids[:-1]
        assert len(ids) == 12 or ids[-1] == word[0]
    assert any(ids.tolist()[-1] == word[0] for ids in stopped.beams.token_ids)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"beam": EngineBeamSearch(5)}, "max_beam_width 4"),
        ({"beam": EngineBeamSearch(2), "num_return_sequences": 2}, "num_return_sequences > 1"),
        ({"beam": EngineBeamSearch(2), "guide": GuideRequest("json")}, "guided decoding"),
        (
            {"beam": EngineBeamSearch(2), "return_generation_logits": True},
            "return_generation_logits",
        ),
    ],
)
def test_beam_requests_the_engine_cannot_serve_are_refused(
    engine: Engine, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(EngineError, match=message):
        engine.submit(make((1, 2, 3), 4, **overrides), lambda output: None)


# TensorRT-LLM's rules where transformers has none or another one.


def test_the_score_counts_generated_tokens_and_leaves_one_token_alone() -> None:
    assert normalised(-6.0, 3, 1.0) == -2.0
    assert normalised(-6.0, 4, 0.5) == -3.0
    assert normalised(-6.0, 1, 2.0) == -6.0
    assert normalised(-6.0, 5, 0.0) == -6.0


def test_diversity_ranks_each_beams_candidates_by_its_index() -> None:
    """``diversity_rate * beam`` is added to every candidate of beam ``beam`` for ranking only
    (transformers' diversity penalty is group beam search, which TensorRT-LLM does not do)."""
    log_probs = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.25, 0.15]]))
    plain = candidates(
        log_probs, [0.0, -0.2], diversity_rate=0.0, count=2, first=False, stopped=[False, False]
    )
    assert [(c.parent, c.token) for c in plain] == [(0, 0), (1, 0)]
    pushed = candidates(
        log_probs, [0.0, -0.2], diversity_rate=1.0, count=3, first=False, stopped=[False, False]
    )
    assert [(c.parent, c.token) for c in pushed] == [(1, 0), (1, 1), (0, 0)]
    assert pushed[0].value == pytest.approx(-0.2 + float(log_probs[1, 0]))
    assert pushed[0].rank == pytest.approx(pushed[0].value + 1.0)


def test_the_first_step_and_stopped_beams_offer_what_tensorrt_llm_offers() -> None:
    log_probs = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    first = candidates(
        log_probs, [0.0, 0.0], diversity_rate=0.0, count=4, first=True, stopped=[False, False]
    )
    assert {c.parent for c in first} == {0}
    stopped = candidates(
        log_probs, [-1.0, -0.5], diversity_rate=0.0, count=4, first=False, stopped=[False, True]
    )
    assert BeamCandidate(1, None, -0.5, -0.5) in stopped
    assert all(c.token is None for c in stopped if c.parent == 1)


def _hypothesis(candidate: BeamCandidate, score: float) -> Hypothesis:
    return Hypothesis((), (), candidate.value, score, EngineFinishReason.END_ID)


def test_choose_takes_ends_among_the_first_width_and_continues_the_rest() -> None:
    search = EngineBeamSearch(2)
    ranked = [
        BeamCandidate(0, 7, -0.1, -0.1),
        BeamCandidate(0, 9, -0.2, -0.2),
        BeamCandidate(1, 7, -0.3, -0.3),
        BeamCandidate(1, 4, -0.4, -0.4),
    ]
    finished = Finished(2)
    chosen = choose(ranked, search, (9,), 3, finished, _hypothesis)
    assert [(c.parent, c.token) for c in chosen] == [(0, 7), (1, 7)]
    assert [h.cum_log_prob for h in finished.items] == [-0.2]
    late = [
        BeamCandidate(0, 9, -0.1, -0.1),
        BeamCandidate(0, 7, -0.2, -0.2),
        BeamCandidate(1, 9, -0.3, -0.3),
        BeamCandidate(1, 4, -0.4, -0.4),
    ]
    fresh = Finished(2)
    chosen = choose(late, search, (9,), 3, fresh, _hypothesis)
    assert [(c.parent, c.token) for c in chosen] == [(0, 7), (1, 4)]
    assert [h.cum_log_prob for h in fresh.items] == [-0.1]


def test_a_full_set_of_finished_beams_takes_only_better_ones() -> None:
    finished = Finished(2)
    for score in (-1.0, -2.0):
        finished.offer(Hypothesis((), (), score, score, EngineFinishReason.END_ID))
    ranked = [
        BeamCandidate(0, 9, -3.0, -3.0),
        BeamCandidate(1, 9, -1.5, -1.5),
        BeamCandidate(0, 5, -4.0, -4.0),
    ]
    choose(ranked, EngineBeamSearch(2), (9,), 0, finished, _hypothesis)
    assert sorted(h.score for h in finished.items) == [-1.5, -1.0]


@pytest.mark.parametrize(
    ("early", "penalty", "best_rank", "done"),
    [
        (1, 0.0, 0.0, True),
        (0, 0.0, -0.5, False),
        (0, 0.0, -2.5, True),
        (0, 1.0, -9.0, True),
        (2, 1.0, -9.0, False),
        (2, -1.0, -9.0, True),
    ],
)
def test_early_stopping_judges_the_best_candidate_at_the_length_tensorrt_llm_takes(
    early: int, penalty: float, best_rank: float, done: bool
) -> None:
    """Unlike transformers, which judges the best running beam, TensorRT-LLM judges the best
    candidate of the step, ended or not: -9 over 3 tokens is -3 with penalty 1, no better than
    the worst finished -2.25, but over the 10 tokens "never" assumes it is -0.9."""
    finished = Finished(2)
    for score in (-1.0, -2.25):
        finished.offer(Hypothesis((), (), score, score, EngineFinishReason.END_ID))
    search = EngineBeamSearch(2, length_penalty=penalty, early_stopping=early)
    assert is_done(finished, search, best_rank, generated=3, max_new=10) is done
    assert not is_done(Finished(2), search, best_rank, generated=3, max_new=10)
