"""LoRA in the torch engine, in-process: TensorRT-LLM's tensors give Hugging Face + PEFT's output,
requests on different adapters and on none share decode steps, and the cache evicts like
TensorRT-LLM's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from deploy.triton.engine.scheduler import Engine
from deploy.triton.engine.types import EngineConfig, EngineError, LoraRequest
from gateway.catalog.lora.convert import BaseShapes, load_adapter
from tests.support.engine import make, run, submit
from tests.support.lora import peft_greedy

MAX_NEW = 16
PROMPT_TEXTS = ["The quick brown fox", "def add(a, b):", "paris is"]


@pytest.fixture(scope="module")
def wire(adapters: dict[str, Path], tiny_model_dir: Path) -> dict[str, LoraRequest]:
    """Each adapter as a request would carry it: float16 weights, 3-column config."""
    shapes = BaseShapes.read(tiny_model_dir)
    out = {}
    for task, (name, folder) in enumerate(sorted(adapters.items()), start=100):
        lora = load_adapter(folder, shapes)
        out[name] = LoraRequest(task, lora.weights.astype(np.float16), lora.config)
    return out


@pytest.fixture(scope="module")
def prompts(tiny_model_dir: Path) -> list[tuple[int, ...]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return [tuple(tokenizer.encode(text)) for text in PROMPT_TEXTS]


@pytest.fixture(scope="module")
def references(
    tiny_model_dir: Path, adapters: dict[str, Path], prompts: list[tuple[int, ...]]
) -> dict[tuple[str | None, int], list[int]]:
    return {
        (name, index): peft_greedy(tiny_model_dir, adapters.get(name or ""), prompt, MAX_NEW)
        for name in (None, *adapters)
        for index, prompt in enumerate(prompts)
    }


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    config = EngineConfig(str(tiny_model_dir), max_batch_size=16, lora_cache_size=1)
    engine = Engine.from_config(config)
    yield engine
    engine.shutdown()


def test_the_adapters_change_the_output(
    references: dict[tuple[str | None, int], list[int]], prompts: list[tuple[int, ...]]
) -> None:
    for index in range(len(prompts)):
        outputs = [references[(name, index)] for name in (None, "lora-a", "lora-b")]
        assert len({tuple(tokens) for tokens in outputs}) == 3, outputs


def test_each_adapter_gives_the_peft_output(
    engine: Engine,
    wire: dict[str, LoraRequest],
    prompts: list[tuple[int, ...]],
    references: dict[tuple[str | None, int], list[int]],
) -> None:
    for name, lora in wire.items():
        for index, prompt in enumerate(prompts):
            result = run(engine, make(prompt, MAX_NEW, lora=lora))
            assert result.tokens() == references[(name, index)], (name, index)


def test_mixed_adapters_share_decode_steps_and_keep_their_outputs(
    engine: Engine,
    wire: dict[str, LoraRequest],
    prompts: list[tuple[int, ...]],
    references: dict[tuple[str | None, int], list[int]],
) -> None:
    names: list[str | None] = [None, "lora-a", "lora-b"]
    jobs = [(names[i % 3], i % len(prompts)) for i in range(12)]
    before = engine.stats().max_running
    results = []
    for name, index in jobs:
        # Every request carries its weights: with a cache of one, the engine keeps each
        # running request's adapter even after a newer one evicts it from the cache.
        lora = wire[name] if name else None
        results.append(submit(engine, make(prompts[index], MAX_NEW, lora=lora)))
    for (name, index), result in zip(jobs, results, strict=True):
        assert result.wait().tokens() == references[(name, index)], (name, index)
    assert engine.stats().max_running > max(before, 3)


def test_an_evicted_task_is_answered_with_tensorrt_llms_error(
    engine: Engine, wire: dict[str, LoraRequest], prompts: list[tuple[int, ...]]
) -> None:
    a, b = wire["lora-a"], wire["lora-b"]
    run(engine, make(prompts[0], 2, lora=a))
    run(engine, make(prompts[0], 2, lora=LoraRequest(a.task_id)))  # cached: the id suffices
    run(engine, make(prompts[0], 2, lora=b))  # a cache of one: A is evicted
    with pytest.raises(EngineError) as caught:
        engine.submit(make(prompts[0], 2, lora=LoraRequest(a.task_id)), lambda _: None)
    assert caught.value.args[0].startswith("Executor failed process requestId ")
    assert caught.value.args[0].endswith(
        f"due to the following error: LoRA task {a.task_id} not found in cache. "
        "Please send LoRA weights with request"
    )


@pytest.mark.parametrize(
    ("config_row", "message"),
    [
        ([9, 0, 4], "lora module id 9 is not supported"),
        ([1, 2, 4], "Invalid layer_idx 2"),
        ([1, 0, 0], "Invalid low_rank"),
        ([1, 0, 64], "holds"),
        ([1, 0, 4, 1], "DoRA"),
    ],
)
def test_bad_lora_tensors_are_refused(
    engine: Engine, prompts: list[tuple[int, ...]], config_row: list[int], message: str
) -> None:
    weights = np.ones((1, 4 * 128), np.float16)
    config = np.array([config_row], np.int32)
    with pytest.raises(EngineError, match=message):
        engine.submit(make(prompts[0], 2, lora=LoraRequest(7, weights, config)), lambda _: None)


def test_different_adapters_never_share_cached_blocks(
    engine: Engine, wire: dict[str, LoraRequest], tiny_model_dir: Path, adapters: dict[str, Path]
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tuple(tokenizer.encode("A long shared system prompt for every adapter. " * 6))
    runs: list[str | None] = ["lora-a", "lora-b", None, "lora-a", None]
    reused = []
    for name in runs:
        result = run(engine, make(prompt, 8, lora=wire[name] if name else None))
        blocks = result.final().blocks
        assert blocks is not None
        reused.append(blocks.reused)
        expected = peft_greedy(tiny_model_dir, adapters.get(name or ""), prompt, 8)
        assert result.tokens() == expected, name
    cached = (len(prompt) - 1) // 32  # the engine's default tokens_per_block
    assert cached > 0
    assert reused == [0, 0, 0, cached, cached]
