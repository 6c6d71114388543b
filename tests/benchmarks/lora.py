"""Benchmark of multi-LoRA decoding in the torch engine: 16 streams on the base model, all on one
adapter, and spread over 4 adapters (rank 8 on every attention and MLP projection).

    python -m tests.benchmarks.lora [--model-dir DIR] [--device cuda] [--dtype bfloat16]

Without ``--model-dir`` the deterministic tiny model is built in a temporary folder.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from deploy.triton.engine.lora import MODULES
from deploy.triton.engine.scheduler import Engine
from deploy.triton.engine.types import (
    EngineConfig,
    EngineRequest,
    LoraRequest,
    SamplingConfig,
    SequenceOutput,
)

STREAMS = 16
RANK = 8


def _adapter(engine: Engine, task_id: int, seed: int) -> LoraRequest:
    """Random rank-8 weights for modules 1-7 of every layer, in TensorRT-LLM's layout."""
    targets = engine.runner.lora_targets
    assert targets is not None, "the model has no Llama-style layers to adapt"
    rng = np.random.default_rng(seed)
    rows, config = [], []
    for layer in range(targets.layers):
        for module_id in range(1, 8):
            (path,) = MODULES[module_id][1]
            fan_in, fan_out = targets.shapes[path]
            rows.append(rng.standard_normal(RANK * (fan_in + fan_out)) * 0.02)
            config.append([module_id, layer, RANK])
    width = max(row.size for row in rows)
    weights = np.zeros((len(rows), width), np.float16)
    for index, row in enumerate(rows):
        weights[index, : row.size] = row
    return LoraRequest(task_id, weights, np.asarray(config, np.int32))


def _run(
    engine: Engine, loras: list[LoraRequest | None], prompt: tuple[int, ...], tokens: int
) -> float:
    """Tokens per second of STREAMS streams, stream i on ``loras[i % len(loras)]``."""
    done = threading.Semaphore(0)
    counts = [0] * STREAMS

    def callback(index: int, output: SequenceOutput) -> None:
        counts[index] += len(output.token_ids)
        if output.finished:
            done.release()

    sampling = SamplingConfig(temperature=0.0, min_tokens=tokens)
    started = time.perf_counter()
    for index in range(STREAMS):
        request = EngineRequest(
            f"bench-{time.monotonic_ns()}-{index}",
            prompt,
            tokens,
            sampling=sampling,
            streaming=True,
            lora=loras[index % len(loras)],
        )
        engine.submit(request, lambda output, index=index: callback(index, output))
    for _ in range(STREAMS):
        done.acquire()
    return sum(counts) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model_dir = args.model_dir
    if model_dir is None:
        from deploy.sidecar.models import build_tiny_model

        model_dir = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    config = EngineConfig(
        model_dir, device=args.device, dtype=args.dtype, max_batch_size=STREAMS, lora_cache_size=8
    )
    engine = Engine.from_config(config)
    try:
        adapters = [_adapter(engine, 1000 + i, i) for i in range(4)]
        prompt = tuple(range(3, 40))
        cases: dict[str, list[LoraRequest | None]] = {
            "base model": [None],
            "one adapter": adapters[:1],
            "4 adapters": adapters,
            "half base, half 4 adapters": [None, adapters[0], None, adapters[1], None,
                                           adapters[2], None, adapters[3]],
        }  # fmt: skip
        _run(engine, [None], prompt, 8)  # warm-up
        results = {
            name: max(_run(engine, loras, prompt, args.tokens) for _ in range(args.rounds))
            for name, loras in cases.items()
        }
    finally:
        engine.shutdown()
    print(f"{STREAMS} streams x {args.tokens} tokens, {model_dir} on {args.device} (best of "
          f"{args.rounds}):")  # fmt: skip
    base = results["base model"]
    for name, rate in results.items():
        print(f"  {name:28} {rate:8.0f} tok/s  ({rate / base:.2f}x the base model)")


if __name__ == "__main__":
    main()
