"""The client side of the replica benchmark: a shared-prefix chat workload and a LoRA workload,
closed-loop over one gateway, and what each run measured."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import msgspec

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
    "valley",
    "orchard",
    "feather",
    "compass",
    "marble",
    "bridge",
    "forest",
    "copper",
    "ribbon",
    "saddle",
    "violet",
    "ember",
    "glacier",
]
MODEL = "bench"
"""The pooled model's public name."""


@dataclass
class Run:
    """What one policy's run measured."""

    policy: str
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    prompt_blocks: int = 0
    """Full KV-cache blocks of every prompt: what a perfect prefix cache could have reused."""
    reused_blocks: float | None = None
    """KV-cache blocks the engines reported reused; None where they publish no such figure."""
    counters: dict[str, float] = field(default_factory=dict)
    """The gateway's ``gateway_replica_*_total`` counters, summed over replicas (``:reason``)."""
    per_replica: dict[str, float] = field(default_factory=dict)
    """Requests routed to each replica."""

    def percentile(self, q: float) -> float | None:
        """The ``q`` quantile of the times to first token (nearest rank)."""
        if not self.ttft_s:
            return None
        ordered = sorted(self.ttft_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds else 0.0

    @property
    def hit_rate(self) -> float | None:
        """Reused KV-cache blocks over the prompts' full blocks."""
        if self.reused_blocks is None or not self.prompt_blocks:
            return None
        return self.reused_blocks / self.prompt_blocks

    @property
    def gateway_prefix_hits(self) -> float:
        """Share of requests sent to the replica that owned their prompt's leading blocks."""
        return self.counters.get("gateway_replica_prefix_hits_total", 0.0) / max(self.requests, 1)

    @property
    def lora_misses_per_1000(self) -> float:
        """Requests that had to carry the adapter's weights, per 1,000 requests."""
        loads = sum(
            value
            for key, value in self.counters.items()
            if key.startswith("gateway_replica_adapter_loads_total")
        )
        return 1000 * loads / max(self.requests, 1)

    @property
    def imbalance(self) -> float | None:
        """Most over fewest requests routed to one replica."""
        counts = list(self.per_replica.values())
        if not counts or min(counts) == 0:
            return None
        return max(counts) / min(counts)


def system_prompt(rng: random.Random, words: int) -> str:
    """A system prompt of ``words`` random words: the prefix a group of requests shares."""
    return "You are assistant " + " ".join(rng.choice(WORDS) for _ in range(words))


OneRequest = Callable[[httpx.AsyncClient, int], Awaitable[None]]


async def prefix_workload(url: str, args: argparse.Namespace, seed: int, run: Run) -> None:
    """Streamed chat requests, each with one of ``args.groups`` long system prompts and a
    question of its own; times to first token, tokens and prompt blocks into ``run``."""
    rng = random.Random(seed)
    prompts = [system_prompt(rng, args.prefix_tokens) for _ in range(args.groups)]
    groups = [rng.randrange(args.groups) for _ in range(args.requests)]

    async def one(client: httpx.AsyncClient, index: int) -> None:
        body = {
            "model": MODEL,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": args.max_tokens,
            "min_tokens": args.max_tokens,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": prompts[groups[index]]},
                {"role": "user", "content": f"question {seed}-{index}: {WORDS[index % 24]}?"},
            ],
        }
        started = time.perf_counter()
        first: float | None = None
        failed = False
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                failed = True
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = msgspec.json.decode(line[6:])
                    if "error" in chunk:
                        failed = True
                        continue
                    if first is None and any(c["delta"].get("content") for c in chunk["choices"]):
                        first = time.perf_counter() - started
                    usage = chunk.get("usage")
                    if usage:
                        run.completion_tokens += usage["completion_tokens"]
                        run.prompt_tokens += usage["prompt_tokens"]
                        run.prompt_blocks += usage["prompt_tokens"] // args.block_tokens
        run.requests += 1
        run.errors += failed
        if first is not None and not failed:
            run.ttft_s.append(first)

    await drive(url, args.requests, one, args.concurrency, run)


async def adapter_workload(url: str, args: argparse.Namespace, seed: int, run: Run) -> None:
    """Completions spread evenly at random over ``args.adapters`` LoRA adapters."""
    rng = random.Random(seed)
    adapters = [rng.randrange(args.adapters) for _ in range(args.requests)]

    async def one(client: httpx.AsyncClient, index: int) -> None:
        body = {
            "model": f"adapter-{adapters[index]}",
            "prompt": f"{WORDS[index % 24]} {seed}-{index}",
            "max_tokens": args.max_tokens,
            "temperature": 0,
        }
        response = await client.post("/v1/completions", json=body)
        run.requests += 1
        if response.status_code != 200:
            run.errors += 1
            return
        usage = response.json()["usage"]
        run.completion_tokens += usage["completion_tokens"]
        run.prompt_tokens += usage["prompt_tokens"]

    await drive(url, args.requests, one, args.concurrency, run)


async def drive(url: str, requests: int, one: OneRequest, concurrency: int, run: Run) -> None:
    """``requests`` calls of ``one``, ``concurrency`` at a time (closed loop)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(requests):
        queue.put_nowait(index)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            await one(client, queue.get_nowait())

    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    run.seconds = time.perf_counter() - started
