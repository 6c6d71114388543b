"""The torch engine's KV store in-process on the tiny model: prefix reuse keeps greedy output,
eviction under a small budget keeps answers right, chunked prefill interleaves with decoding,
and the block counts add up in every iteration."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.triton.engine.scheduler import Engine
from deploy.triton.engine.types import (
    EngineConfig,
    EngineError,
    IterationStats,
    KvCacheConfig,
    SequenceOutput,
)
from tests.support.engine import MAX_SEQ_LEN, TIMEOUT_S, Result, make, reference, run, submit

BLOCK = 8
SYSTEM = "You are a helpful assistant. Answer in one short sentence, and be kind. " * 2


def _engine(model_dir: Path, **overrides: Any) -> Engine:
    kv = overrides.pop("kv_cache", KvCacheConfig(tokens_per_block=BLOCK))
    config = EngineConfig(
        str(model_dir), max_batch_size=8, max_seq_len=MAX_SEQ_LEN, kv_cache=kv, **overrides
    )
    return Engine.from_config(config)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    engine = _engine(tiny_model_dir)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def encode(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return lambda text: tuple(tokenizer.encode(text))


def _reused(result: Result) -> int:
    blocks = result.final().blocks
    assert blocks is not None
    return blocks.reused


def test_the_same_prompt_twice_reuses_its_blocks_and_keeps_the_greedy_tokens(
    engine: Engine, encode: Any, hf_model: Any
) -> None:
    prompt = encode(SYSTEM + "What is the capital of France?")
    first = run(engine, make(prompt, 12))
    second = run(engine, make(prompt, 12))
    assert _reused(first) == 0
    assert _reused(second) == (len(prompt) - 1) // BLOCK  # all but the last token's block
    assert first.tokens() == second.tokens() == reference(hf_model, prompt, 12)
    blocks = second.final().blocks
    assert blocks is not None and blocks.alloc_total == -(-len(prompt) // BLOCK) - blocks.reused


def test_prompts_sharing_a_system_prompt_share_its_blocks(
    engine: Engine, encode: Any, hf_model: Any
) -> None:
    system = encode("<sys> " + SYSTEM)
    questions = [encode(" Who wrote Hamlet?"), encode(" Name a prime number.")]
    first = run(engine, make(system + questions[0], 10))
    second = run(engine, make(system + questions[1], 10))
    assert _reused(first) == 0
    assert _reused(second) == len(system) // BLOCK
    for result, question in zip((first, second), questions, strict=True):
        assert result.tokens() == reference(hf_model, system + question, 10)


def test_prompt_table_ids_keep_equal_tokens_apart(engine: Engine, encode: Any) -> None:
    prompt = encode("<table> " + SYSTEM)
    first = len(prompt) // BLOCK  # full blocks of the prompt
    assert first >= 3
    marked = [0] * len(prompt)
    marked[BLOCK + 1] = 9  # a prompt-table row inside the second block
    run(engine, make(prompt, 4))
    tabled = run(engine, make(prompt, 4, extra_ids=tuple(marked)))
    assert _reused(tabled) == 1  # only the block before the table row
    again = run(engine, make(prompt, 4, extra_ids=tuple(marked)))
    assert _reused(again) == (len(prompt) - 1) // BLOCK


def test_without_reuse_nothing_is_found_and_greedy_tokens_are_the_same(
    tiny_model_dir: Path, encode: Any, engine: Engine
) -> None:
    prompt = encode(SYSTEM + "Is the answer the same without reuse?")
    plain = _engine(
        tiny_model_dir, kv_cache=KvCacheConfig(tokens_per_block=BLOCK, enable_reuse=False)
    )
    try:
        runs = [run(plain, make(prompt, 12)) for _ in range(2)]
    finally:
        plain.shutdown()
    run(engine, make(prompt, 12))
    reused = run(engine, make(prompt, 12))
    assert [_reused(result) for result in runs] == [0, 0]
    assert _reused(reused) > 0
    assert runs[0].tokens() == runs[1].tokens() == reused.tokens()


def test_streams_of_one_prompt_fork_its_blocks(engine: Engine, encode: Any, hf_model: Any) -> None:
    prompt = encode(SYSTEM + "Count to three.")
    result = run(engine, make(prompt, 10, num_return_sequences=3))
    expected = reference(hf_model, prompt, 10)
    assert [result.tokens(i) for i in range(3)] == [expected] * 3


def test_context_logits_compute_the_whole_prompt(engine: Engine, encode: Any) -> None:
    prompt = encode(SYSTEM + "Context logits, please.")
    run(engine, make(prompt, 2))
    result = run(engine, make(prompt, 2, return_context_logits=True))
    assert _reused(result) == 0
    logits = result.final().context_logits
    assert logits is not None and logits.shape[0] == len(prompt)


def test_eviction_under_a_small_budget_keeps_answers_correct(
    tiny_model_dir: Path, encode: Any, hf_model: Any
) -> None:
    budget = KvCacheConfig(tokens_per_block=BLOCK, max_tokens=12 * BLOCK)
    engine = _engine(tiny_model_dir, kv_cache=budget)
    try:
        assert engine.max_seq_len == 12 * BLOCK  # one sequence can always fill the cache
        prompts = [encode(f"Topic {n}: " + SYSTEM[: 40 + 9 * n]) for n in range(5)]
        results = [submit(engine, make(prompt, 16)) for prompt in prompts * 2]
        for result, prompt in zip(results, prompts * 2, strict=True):
            assert result.wait().tokens() == reference(hf_model, prompt, 16)
        again = run(engine, make(prompts[-1], 16))
        assert again.tokens() == reference(hf_model, prompts[-1], 16)
        stats = engine.stats().kv_cache
        assert stats is not None and stats.max_blocks == 12
        assert stats.alloc_total > stats.alloc_new  # cached blocks were evicted for new ones
        assert stats.used_blocks == 0 and stats.free_blocks == 12
        with pytest.raises(EngineError, match="KV-cache blocks"):
            engine.submit(make(prompts[0], 90, num_return_sequences=4), lambda _: None)
    finally:
        engine.shutdown()


class _Stream(Result):
    """A streaming request that tells when its first token came."""

    def __init__(self) -> None:
        super().__init__(1)
        self.started = threading.Event()

    def __call__(self, output: SequenceOutput) -> None:
        super().__call__(output)
        self.started.set()


def test_a_running_sequence_shares_its_prompt_blocks(engine: Engine, encode: Any) -> None:
    prompt = encode("<running> " + SYSTEM)
    stream = _Stream()
    engine.submit(make(prompt, 200, end_ids=(), streaming=True), stream)
    assert stream.started.wait(TIMEOUT_S)
    second = run(engine, make(prompt, 4))
    assert not stream.done.is_set()  # still generating while its blocks were found
    assert _reused(second) == (len(prompt) - 1) // BLOCK
    engine.stop(stream.outputs[0].request_id)
    stream.wait()


def _interleaving(model_dir: Path, encode: Any, *, chunked: bool) -> list[IterationStats]:
    """The iterations of a long prompt's prefill while another stream decodes."""
    engine = _engine(model_dir, enable_chunked_context=chunked, max_num_tokens=2 * BLOCK)
    try:
        stream = _Stream()
        engine.submit(make(encode("Tell me a story."), 150, end_ids=(), streaming=True), stream)
        assert stream.started.wait(TIMEOUT_S)
        engine.iteration_stats()
        long = run(engine, make(encode(SYSTEM * 2), 1))
        assert long.tokens()
        iterations = engine.iteration_stats()
        engine.stop(stream.outputs[0].request_id)
        stream.wait()
    finally:
        engine.shutdown()
    return [it for it in iterations if it.context_tokens]


def test_chunked_prefill_decodes_the_running_stream_between_chunks(
    tiny_model_dir: Path, encode: Any
) -> None:
    prompt = len(encode(SYSTEM * 2))
    chunks = _interleaving(tiny_model_dir, encode, chunked=True)
    assert sum(it.context_tokens for it in chunks) == prompt
    assert len(chunks) == -(-prompt // (2 * BLOCK))
    assert all(it.context_tokens <= 2 * BLOCK for it in chunks)
    # Every iteration that prefilled a chunk also decoded the running stream's next token.
    assert all(it.generation_requests == 1 for it in chunks)
    whole = _interleaving(tiny_model_dir, encode, chunked=False)
    assert [it.context_tokens for it in whole] == [prompt]


def test_block_counts_add_up_in_every_iteration(engine: Engine, encode: Any) -> None:
    engine.iteration_stats()
    results = [submit(engine, make(encode(SYSTEM + str(n)), 20)) for n in range(6)]
    for result in results:
        result.wait()
    iterations = engine.iteration_stats()
    assert iterations
    pools = [it.kv_cache for it in iterations]
    assert all(kv.free_blocks + kv.used_blocks == kv.max_blocks for kv in pools)
    assert max(kv.used_blocks for kv in pools) > 0
    assert pools[-1].used_blocks == 0
    assert pools[-1].reused >= 5 * (len(encode(SYSTEM)) // BLOCK)
