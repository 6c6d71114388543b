"""Guided decoding in the torch engine: tokens/s of 16 streams guided vs free, and grammar
compilation time of a typical tool schema, cold and cached.

``python -m tests.benchmarks.guided [--smollm]`` prints the figures; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from deploy.sidecar.models import ensure_smollm2, ensure_tiny_model
from deploy.triton.engine.guided import GuidedDecoding
from deploy.triton.engine.scheduler import Engine
from deploy.triton.engine.types import (
    EngineConfig,
    EngineRequest,
    GuidedConfig,
    GuideRequest,
    SamplingConfig,
)
from gateway.tools.formats import Function, tool_format
from gateway.tools.output import auto_guide, calls_schema, required_guide
from tests.support.engine import Result

STREAMS = 16
FUNCTIONS = (
    Function(
        "get_weather",
        "Current weather of a city",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city", "unit"],
        },
    ),
    Function(
        "search",
        "Search the web",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer"},
                "sites": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["query"],
        },
    ),
)
# Any text of letters and spaces: as long as free text, so both runs make the same tokens.
LONG_REGEX = "[a-zA-Z ,.]+"


def _run(engine: Engine, prompts: list[tuple[int, ...]], max_new: int, guide: Any) -> float:
    results = []
    start = time.perf_counter()
    for index, prompt in enumerate(prompts):
        request = EngineRequest(
            f"bench-{time.monotonic_ns()}-{index}",
            prompt,
            max_new,
            sampling=SamplingConfig(temperature=1.0, top_p=0.95, seed=index, min_tokens=max_new),
            guide=guide,
        )
        result = Result(1)
        engine.submit(request, result)
        results.append(result)
    tokens = sum(len(result.wait().tokens()) for result in results)
    return tokens / (time.perf_counter() - start)


def throughput(model_dir: str, max_new: int, rounds: int) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = Engine.from_config(
        EngineConfig(model_dir, max_batch_size=STREAMS, max_seq_len=1024, guided=GuidedConfig())
    )
    texts = [f"Story number {i}: once upon a time" for i in range(STREAMS)]
    prompts = [tuple(tokenizer.encode(text)) for text in texts]
    guide = GuideRequest("regex", LONG_REGEX)
    try:
        _run(engine, prompts, 4, None)
        free = [_run(engine, prompts, max_new, None) for _ in range(rounds)]
        guided = [_run(engine, prompts, max_new, guide) for _ in range(rounds)]
    finally:
        engine.shutdown()
    f, g = statistics.median(free), statistics.median(guided)
    print(
        f"{model_dir}: {STREAMS} streams x {max_new} tokens: free {f:,.0f} tok/s, "
        f"guided {g:,.0f} tok/s ({g / f:.2f}x, {1e3 / g - 1e3 / f:+.3f} ms per token)"
    )


def compilation(model_dir: str) -> None:
    import xgrammar as xgr
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer)
    schemas = {
        "required, JSON list (2 tools)": GuideRequest(
            "json_schema", json.dumps(calls_schema(FUNCTIONS, True))
        ),
        "required, call tags (2 tools)": _tag_request(required=True),
        "auto structural tag": _tag_request(),
    }
    for name, request in schemas.items():
        cold = []
        for _ in range(5):
            guided = GuidedDecoding(info)
            start = time.perf_counter()
            guided.compile(request)
            cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(100):
            guided.compile(request)
        cached = (time.perf_counter() - start) / 100
        print(
            f"{model_dir}: compile {name}: cold {statistics.median(cold) * 1e3:.2f} ms, "
            f"cached {cached * 1e6:.1f} µs"
        )


def mask_cost(model_dir: str) -> None:
    """CPU time to fill and expand one sequence's mask, per token, along a valid call list."""
    import torch
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from deploy.triton.engine.guided import grammar_masks

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    guided = GuidedDecoding(xgr.TokenizerInfo.from_huggingface(tokenizer))
    compiled = guided.compile(
        GuideRequest("json_schema", json.dumps(calls_schema(FUNCTIONS, True)))
    )
    text = '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]'
    tokens = tokenizer.encode(text, add_special_tokens=False)
    states = [guided.matcher(compiled, ()) for _ in range(STREAMS)]
    start = time.perf_counter()
    for token in tokens:
        grammar_masks(states, guided.vocab_size, torch.device("cpu"))
        for state in states:
            state.accept(token)
    per_token = (time.perf_counter() - start) / len(tokens)
    print(
        f"{model_dir}: mask of {STREAMS} guided sequences: {per_token * 1e3:.2f} ms per step "
        f"({per_token / STREAMS * 1e6:.0f} µs per sequence per token, vocab {guided.vocab_size})"
    )


def _tag_request(required: bool = False) -> GuideRequest:
    build = required_guide if required else auto_guide
    guide = build(tool_format("hermes"), FUNCTIONS, True)
    assert guide is not None and guide.guide is not None
    return GuideRequest("structural_tag", guide.guide)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smollm", action="store_true", help="also SmolLM2-135M (49k vocab)")
    args = parser.parse_args()
    tiny = str(ensure_tiny_model())
    compilation(tiny)
    mask_cost(tiny)
    throughput(tiny, 128, 3)
    if args.smollm:
        smollm = str(ensure_smollm2())
        compilation(smollm)
        mask_cost(smollm)
        throughput(smollm, 32, 2)


if __name__ == "__main__":
    main()
