"""The disaggregated benchmark's load: running streams of a fixed length, long prompts arriving
at a steady rate beside them, and the figures of one setup (the streams' inter-token latency,
the long requests' time to first token, the handoffs the generation engine counted)."""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.benchmarks.loadgen import HttpClient, Sample
from tests.support.prometheus import total

DISAGG = "nv_trt_llm_disaggregated_serving_metrics"
WORDS = [
    "river",
    "stone",
    "cloud",
    "garden",
    "window",
    "lantern",
    "harbor",
    "meadow",
    "silver",
    "candle",
    "thunder",
    "orchard",
    "valley",
    "copper",
    "mirror",
    "forest",
    "beacon",
    "canyon",
    "saddle",
    "marble",
    "pepper",
    "violet",
    "anchor",
    "island",
    "kettle",
    "ladder",
    "pocket",
    "ribbon",
    "shadow",
    "timber",
    "walnut",
    "yellow",
    "basket",
    "circle",
    "dragon",
    "engine",
]


def prompt_of(tokenizer: Any, rng: random.Random, tokens: int) -> str:
    """Random words cut to ``tokens`` tokens of ``tokenizer``: each prompt its own from its
    first words, so no engine holds a cached prefix of it."""
    text = " ".join(rng.choice(WORDS) for _ in range(tokens))
    ids = tokenizer(text, add_special_tokens=False).input_ids
    while len(ids) < tokens:
        text += " " + " ".join(rng.choice(WORDS) for _ in range(tokens))
        ids = tokenizer(text, add_special_tokens=False).input_ids
    return str(tokenizer.decode(ids[:tokens]))


def _body(model: str, prompt: str, tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }


def _client(url: str, body: dict[str, Any]) -> HttpClient:
    address = urlsplit(url)
    host, port = address.hostname or "127.0.0.1", address.port or 80
    return HttpClient(host, port, "/v1/completions", body, "none")


async def _send(client: HttpClient) -> Sample:
    sample = Sample(start=time.perf_counter())
    try:
        await client.send(sample)
    except Exception as exc:  # a failed request is counted, and the load goes on
        sample.error = repr(exc)
    return sample


def arrivals(sample: Sample) -> list[float]:
    """The times its tokens arrived (``time.perf_counter`` seconds)."""
    if not sample.tokens:
        return []
    times = [sample.first]
    for gap in sample.gaps:
        times.append(times[-1] + gap)
    return times


def quantiles_ms(values: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds (NaN where there are no values)."""
    if not values:
        return (float("nan"), float("nan"))
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (statistics.median(ordered) * 1e3, p99 * 1e3)


@dataclass(frozen=True)
class SetupFigures:
    """One setup's figures over the measured window."""

    setup: str
    itl_ms: tuple[float, float]
    """The running streams' gaps between tokens that arrived in the window: p50, p99."""
    ttft_ms: tuple[float, float]
    """The long requests' time to first token: p50, p99."""
    second_token_ms: tuple[float, float]
    """The long requests' gap between first and second token (a split request's handoff)."""
    stream_tokens_s: float
    """Tokens per second the running streams received in the window."""
    long_done: int
    long_errors: int
    stream_errors: int
    handoffs: float
    """Handoffs the generation engine counted during the window and after."""
    handoff_ms: float
    """Their mean time in milliseconds (NaN without handoffs)."""
    first_error: str | None = None

    @property
    def handoff_share(self) -> float:
        """The mean handoff's time as a share of the median time to first token."""
        return self.handoff_ms / self.ttft_ms[0] if self.handoffs else float("nan")


async def _transfers(http: httpx.AsyncClient, metrics_url: str) -> tuple[float, float]:
    text = (await http.get(metrics_url)).text
    count = total(text, DISAGG, disaggregated_serving_type="request_count")
    return count, total(text, DISAGG, disaggregated_serving_type="kv_cache_transfer_ms")


async def run_setup(
    setup: str,
    url: str,
    model: str,
    generation_metrics: str,
    tokenizer: Any,
    args: Any,
) -> SetupFigures:
    """``args.streams`` streams of ``args.stream_tokens`` tokens, each sent again as soon as it
    ends; after ``args.warmup`` seconds, long prompts at ``args.long_rate`` per second for
    ``args.seconds``; then the streams finish the requests they have in flight."""
    rng = random.Random(f"{setup}-{args.seed}")
    stream_samples: list[Sample] = []
    stopping = False

    async def stream(worker: int) -> None:
        prompt = prompt_of(tokenizer, rng, args.stream_prompt_tokens)
        client = _client(url, _body(model, prompt, args.stream_tokens))
        while not stopping:
            stream_samples.append(await _send(client))

    long_prompts = [
        prompt_of(tokenizer, rng, args.long_prompt_tokens)
        for _ in range(max(1, round(args.seconds * args.long_rate)))
    ]
    async with httpx.AsyncClient(timeout=30) as http:
        workers = [asyncio.create_task(stream(k)) for k in range(args.streams)]
        await asyncio.sleep(args.warmup)
        before = await _transfers(http, generation_metrics)
        start = time.perf_counter()
        longs = []
        for index, prompt in enumerate(long_prompts):
            await asyncio.sleep(max(0.0, start + index / args.long_rate - time.perf_counter()))
            client = _client(url, _body(model, prompt, args.long_tokens))
            longs.append(asyncio.create_task(_send(client)))
        await asyncio.sleep(max(0.0, start + args.seconds - time.perf_counter()))
        end = time.perf_counter()
        long_samples = await asyncio.gather(*longs)
        stopping = True
        await asyncio.gather(*workers)
        # The engine publishes its counters every stats period.
        await asyncio.sleep(1.0)
        after = await _transfers(http, generation_metrics)
    return _figures(setup, stream_samples, long_samples, (start, end), before, after)


def _figures(
    setup: str,
    streams: list[Sample],
    longs: list[Sample],
    window: tuple[float, float],
    before: tuple[float, float],
    after: tuple[float, float],
) -> SetupFigures:
    start, end = window
    gaps, received = [], 0
    for sample in streams:
        if sample.error is not None:
            continue
        times = arrivals(sample)
        received += sum(1 for t in times if start <= t <= end)
        gaps += [b - a for a, b in itertools.pairwise(times) if start <= b <= end]
    done = [s for s in longs if s.error is None and s.tokens]
    handoffs = after[0] - before[0]
    return SetupFigures(
        setup=setup,
        itl_ms=quantiles_ms(gaps),
        ttft_ms=quantiles_ms([s.first - s.start for s in done]),
        second_token_ms=quantiles_ms([s.gaps[0] for s in done if s.gaps]),
        stream_tokens_s=received / (end - start),
        long_done=len(done),
        long_errors=len(longs) - len(done),
        stream_errors=sum(1 for s in streams if s.error is not None),
        handoffs=handoffs,
        handoff_ms=(after[1] - before[1]) / handoffs if handoffs else float("nan"),
        first_error=next((s.error for s in [*longs, *streams] if s.error is not None), None),
    )
