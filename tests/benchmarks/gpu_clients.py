"""The clients of the GPU benchmark: a completion streamed through the gateway, and the same
completion straight to the sidecar's ``ensemble`` over gRPC, plain or asking for what the
gateway asks beyond the text; the order their runs take; chats to every model at once."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

PROMPT = (
    "Write a detailed report on the history of the printing press, its inventors, the spread "
    "of printed books across Europe and the effects on science, religion and politics. "
) * 3
_IDS = itertools.count()


# What a target calls the entry model it reaches, from the gateway's ``entry`` setting.
ENTRY_NAMES = {"ensemble": "ensemble", "tensorrt_llm_bls": "bls", "tensorrt_llm": "engine"}


@dataclass(frozen=True)
class Way:
    """One way the gateway reaches the pipeline: a transport to Triton and the entry model (the
    ``ensemble`` as the direct client, or ``tensorrt_llm`` itself: the gateway then tokenizes
    and detokenizes)."""

    transport: str
    entry: str


def gateway_ways(transports: list[str], entries: list[str]) -> list[Way]:
    """Every transport to every entry."""
    return [Way(transport, entry) for entry in entries for transport in transports]


def _suffix(way: Way, ways: list[Way]) -> str:
    """What tells ``way`` from the others: its transport, its entry, or both."""
    parts = []
    if len({w.transport for w in ways}) > 1:
        parts.append(way.transport)
    if len({w.entry for w in ways}) > 1:
        parts.append(ENTRY_NAMES[way.entry])
    return "-".join(parts)


def gateway_model(name: str, way: Way, ways: list[Way]) -> str:
    """The gateway's name for a pipeline reached by ``way``: the pipeline's own name for the
    first way, suffixed for the others."""
    return name if way == ways[0] else f"{name}-{_suffix(way, ways)}"


def gateway_targets(ways: list[Way]) -> list[str]:
    """``gateway`` for one way; ``gateway-http``, ``gateway-grpc-engine``... for several."""
    return ["gateway"] if len(ways) == 1 else [f"gateway-{_suffix(w, ways)}" for w in ways]


def gateway_client(url: str, model: str, tokens: int) -> Any:
    """A client streaming the benchmark's completion through the gateway again and again on one
    kept-alive connection: raw HTTP/1.1 and no JSON decoding but the usage (the load
    generator's client), so that the client's own cost stays far below the gateway's."""
    from urllib.parse import urlsplit

    from tests.benchmarks.loadgen import HttpClient

    address = urlsplit(url)
    return HttpClient(address.hostname or "127.0.0.1", address.port or 80, "/v1/completions",
                      gateway_body(model, tokens), "none")  # fmt: skip


def gateway_body(model: str, tokens: int) -> dict[str, Any]:
    """The benchmark's completion: greedy, exactly ``tokens`` long, streamed with its usage."""
    return {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def gateway_stream(client: Any) -> dict[str, Any]:
    """One streamed completion through the gateway: arrival times of its chunks."""
    from tests.benchmarks.loadgen import Sample

    sample = Sample(start=time.perf_counter())
    await client.send(sample)
    arrivals: list[float] = []
    if sample.first:
        arrivals.append(sample.first - sample.start)
        for gap in sample.gaps:
            arrivals.append(arrivals[-1] + gap)
    return {
        "arrivals": arrivals,
        "end": time.perf_counter() - sample.start,
        "tokens": sample.tokens,
    }


_SEED = 0x5EED
"""The direct client's seed: the gateway sends each request a random one unless it names one."""

# What the direct requests may add, each the way the gateway sends it: greedy spelled out as
# temperature 0 and top_k 1 (the gateway's form for every release) with top_p 1 and a seed
# (what the gateway adds to a request naming neither), TensorRT-LLM's perf
# metrics (which the gateway asks for to report cached_tokens), the output token count (log
# probs where the model reports no count), ``prompt``: the prompt's token count too (which the
# gateway asks for only for prompts with images). ``spread`` changes no tensor: the client waits
# a random moment before every request, so that requests arrive spread out rather than in bursts.
DIRECT_EXTRAS = ("greedy", "perf", "counts", "prompt", "spread")


def direct_request(
    model: str, tokens: int, extras: tuple[str, ...] = (), release: str = "latest"
) -> Any:
    """The ensemble request a minimal gRPC client sends: text, lengths, streaming on; plus
    ``extras`` (of ``DIRECT_EXTRAS``)."""
    import numpy as np

    from adapters.triton.grpc.stream import infer_request
    from adapters.triton.wire import WireTensor

    def tensor(name: str, value: Any, datatype: str, dtype: Any) -> WireTensor:
        return WireTensor(name, datatype, np.array([[value]], dtype=dtype))

    inputs = [
        tensor("text_input", PROMPT.encode(), "BYTES", np.object_),
        tensor("max_tokens", tokens, "INT32", np.int32),
        # TensorRT-LLM 1.x's ensemble calls it min_tokens.
        tensor("min_tokens" if release == "latest" else "min_length", tokens, "INT32", np.int32),
        tensor("stream", True, "BOOL", np.bool_),
    ]
    if "greedy" in extras:
        inputs.append(tensor("temperature", 0.0, "FP32", np.float32))
        # OpenAI's top_p of 1 where the request names neither top_p nor top_k.
        inputs.append(tensor("top_p", 1.0, "FP32", np.float32))
        inputs.append(tensor("top_k", 1, "INT32", np.int32))
        # A seed of every request's own (one value here: the tensor costs the same).
        seed = "seed" if release == "latest" else "random_seed"
        inputs.append(tensor(seed, _SEED, "UINT64", np.uint64))
    outputs = ["text_output"]
    if "perf" in extras:
        # The gateway's way to the reused KV blocks of a prompt (its cached tokens): the engine
        # adds its perf metrics to a request's first and last responses.
        inputs.append(tensor("return_perf_metrics", True, "BOOL", np.bool_))
        outputs.append("kv_cache_reused_blocks")
    if "counts" in extras:
        if release == "latest":
            # TensorRT-LLM 1.x's ensemble reports the token counts on every response.
            names = ["num_output_tokens"] + (["num_input_tokens"] if "prompt" in extras else [])
            for name in names:
                inputs.append(tensor(f"return_{name}", True, "BOOL", np.bool_))
                outputs.append(name)
        else:
            # Earlier ensembles report no counts: the gateway counts output tokens by their
            # log probs, one per token.
            inputs.append(tensor("return_log_probs", True, "BOOL", np.bool_))
            outputs.append("output_log_probs")
    return infer_request(f"{model}_ensemble", "bench", inputs, outputs)


async def direct_stream(stub: Any, request: Any) -> dict[str, Any]:
    """The same completion straight to the sidecar's ``ensemble`` over gRPC streaming."""
    import grpc

    start = time.perf_counter()
    arrivals: list[float] = []
    message = type(request)()
    message.CopyFrom(request)
    message.id = f"bench-{next(_IDS)}"
    call = stub.ModelStreamInfer(iter([message]))
    tokens = 0
    while True:
        response = await call.read()
        if response is grpc.aio.EOF:
            break
        if response.error_message:
            raise RuntimeError(response.error_message)
        # One response per generated token. A token without text of its own (one that ends
        # inside a character, or a special token) is counted but not timed: the gateway sends
        # no event for it, so both targets time the arrivals of text, as a reader sees them.
        if response.infer_response.raw_output_contents:
            tokens += 1
            if carries_text(response.infer_response):
                arrivals.append(time.perf_counter() - start)
    return {"arrivals": arrivals, "end": time.perf_counter() - start, "tokens": tokens}


def carries_text(response: Any) -> bool:
    """Whether an ensemble's response has text in its ``text_output`` (a BYTES tensor of one
    element: its 4-byte length, then the bytes)."""
    for output, raw in zip(response.outputs, response.raw_output_contents, strict=False):
        if output.name == "text_output":
            return len(raw) > 4
    return False


def direct_targets(variants: list[str]) -> list[str]:
    """``direct``, then ``direct-greedy``, ``direct-perf``, ``direct-greedy-perf`` as asked."""
    return ["direct", *(f"direct-{v}" for v in variants if v)]


Run = tuple[str, int]
"""A target's run: its name and the repeat it pairs with direct's run in."""


def schedule(targets: list[str], repeats: int, side_by_side: bool) -> list[tuple[Run, ...]]:
    """The runs of one level, in order; the runs of a group run at once.

    One after another, every target once a repeat, in an order that turns: reversed every
    other repeat and rotated by one every two, so that over ``2 * len(targets)`` repeats every
    target runs as often in every place (first, between, last) and a drift of the host, or
    what a run leaves to the next, falls on every target alike. ``side_by_side``: every other
    target beside direct, the two at once (each with half the streams, the engine's steps
    serving both), a repeat of its own for each pair."""
    if not side_by_side:
        return [
            ((target, repeat),) for repeat in range(repeats) for target in turn(targets, repeat)
        ]
    others = [target for target in targets if target != "direct"]
    pairs = [
        target
        for repeat in range(repeats)
        for target in (others if repeat % 2 == 0 else others[::-1])
    ]
    return [(("direct", run), (target, run)) for run, target in enumerate(pairs)]


def turn(targets: list[str], repeat: int) -> list[str]:
    """The order of ``targets`` in ``repeat``: rotated by ``repeat // 2``, reversed when odd."""
    shift = (repeat // 2) % len(targets)
    order = targets[shift:] + targets[:shift]
    return order if repeat % 2 == 0 else order[::-1]


async def both_models(url: str, models: list[str], streams: int, tokens: int) -> dict[str, Any]:
    """Chat streams to every model at once through the gateway; tokens/s of each."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:

        async def one(model: str) -> int:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": tokens,
                "min_tokens": tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            used = 0
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and '"usage":{' in line.replace(" ", ""):
                        used = json.loads(line[6:])["usage"]["completion_tokens"]
            return used

        start = time.perf_counter()
        jobs = [one(model) for model in models for _ in range(streams)]
        counts = await asyncio.gather(*jobs)
        wall = time.perf_counter() - start
    per_model = {m: sum(counts[i * streams : (i + 1) * streams]) for i, m in enumerate(models)}
    return {
        "streams_per_model": streams,
        "wall_s": wall,
        "tokens": per_model,
        "tokens_per_s": {m: n / wall for m, n in per_model.items()},
        "all_complete": all(c == tokens for c in counts),
    }
