"""Mixed batching on the tiny model: prompts ride in the decode step's pass, packed with its rows,
and every request still decodes exactly as transformers does alone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from deploy.triton.engine import mixed, packed
from deploy.triton.engine.mixed import MixedBatching
from deploy.triton.engine.runner import ModelRunner
from deploy.triton.engine.scheduler import Engine
from deploy.triton.engine.types import EngineConfig
from tests.support.engine import MAX_SEQ_LEN, TIMEOUT_S, make, reference, submit

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):",
    "paris",
    "a b c d e f g h i j k l m n",
    "one two three",
]


@pytest.fixture(scope="module")
def prompts(tiny_model_dir: Path) -> list[tuple[int, ...]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return [tuple(tokenizer.encode(text)) for text in PROMPTS]


class Passes:
    """Counts the forward passes of a runner's model."""

    def __init__(self, runner: ModelRunner) -> None:
        self.count = 0
        self._hook = runner.model.register_forward_hook(self._seen)

    def _seen(self, *_: Any) -> None:
        self.count += 1

    def close(self) -> None:
        self._hook.remove()


def unstarted(model_dir: Path, **options: Any) -> tuple[Engine, Passes]:
    """An engine whose thread has not started, so that what is submitted waits together."""
    config = EngineConfig(str(model_dir), max_batch_size=8, max_seq_len=MAX_SEQ_LEN, **options)
    runner = ModelRunner.load(config)
    engine = Engine(runner, config)
    return engine, Passes(runner)


@pytest.fixture
def engines(tiny_model_dir: Path) -> Iterator[list[tuple[Engine, Passes]]]:
    made: list[tuple[Engine, Passes]] = []
    yield made
    for engine, passes in made:
        passes.close()
        engine.shutdown()


@pytest.mark.parametrize("mixed_batching", [True, False])
def test_a_burst_of_prompts_prefills_in_one_pass_only_when_mixed(
    tiny_model_dir: Path,
    engines: list[tuple[Engine, Passes]],
    hf_model: Any,
    prompts: list[tuple[int, ...]],
    mixed_batching: bool,
) -> None:
    engine, passes = unstarted(tiny_model_dir, mixed_batching=mixed_batching)
    engines.append((engine, passes))
    assert (engine.mixed is not None) == mixed_batching
    lengths = [12, 7, 9, 12, 5]
    results = [submit(engine, make(p, n)) for p, n in zip(prompts, lengths, strict=True)]
    engine.start()
    for result, prompt, n in zip(results, prompts, lengths, strict=True):
        assert result.wait().tokens() == reference(hf_model, prompt, n)
    steps = engine.stats().steps
    if mixed_batching:
        # One pass for all five prompts, then the decode steps.
        assert passes.count == steps + 1
    else:
        assert passes.count == steps + len(prompts)


def test_prompts_joining_a_running_batch_cost_no_pass_of_their_own(
    tiny_model_dir: Path,
    engines: list[tuple[Engine, Passes]],
    hf_model: Any,
    prompts: list[tuple[int, ...]],
) -> None:
    engine, passes = unstarted(tiny_model_dir)
    engines.append((engine, passes))
    engine.start()
    first = submit(engine, make(prompts[0], 60, streaming=True))
    deadline = time.monotonic() + TIMEOUT_S
    while not first.outputs and time.monotonic() < deadline:
        time.sleep(0.001)
    assert first.outputs, "the first request never started"
    late = [submit(engine, make(p, 8)) for p in prompts[1:]]
    for result, prompt in zip(late, prompts[1:], strict=True):
        assert result.wait().tokens() == reference(hf_model, prompt, 8)
    assert first.wait().tokens() == reference(hf_model, prompts[0], 60)
    # The first prompt ran alone (nothing to share a pass with), then its decode step; every
    # later prompt joined a pass of the running batch.
    assert passes.count == engine.stats().steps + 1


def test_the_probe_turns_mixed_batching_off_where_a_packed_pass_differs(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = EngineConfig(str(tiny_model_dir), max_batch_size=4, max_seq_len=MAX_SEQ_LEN)
    runner = ModelRunner.load(config)
    engine = Engine(runner, config)
    assert engine.mixed is not None
    assert mixed.probe(runner, engine.store.pool.layout) < 1e-4
    planned = packed.plan

    def forgetful(*args: Any) -> Any:
        """A plan whose chunks forget their cached past: they attend to their own tokens only."""
        plan, write, positions = planned(*args)
        chunks = tuple(
            packed.Chunk(chunk.read[:, -chunk.count :], chunk.count, None) for chunk in plan.chunks
        )
        return packed.PackedPlan(plan.rows, plan.row_read, plan.row_mask, chunks), write, positions

    monkeypatch.setattr(packed, "plan", forgetful)
    assert mixed.probe(runner, engine.store.pool.layout) > 1e-2
    assert MixedBatching.enable(runner, engine.context) is None


def test_a_sliding_window_model_runs_separate_passes(tmp_path: Path) -> None:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    MistralForCausalLM(config).save_pretrained(tmp_path)
    engine_config = EngineConfig(str(tmp_path), max_batch_size=4, max_seq_len=64)
    runner = ModelRunner.load(engine_config)
    engine = Engine(runner, engine_config)
    assert engine.mixed is None
