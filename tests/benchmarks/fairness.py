"""Fair queueing under a flood: what a quiet tenant sees beside one that floods a full model.

One tritonserver serves the paced load-test engine, ``--slots`` streams at once (the engine's
batch), and a gateway in this process caps the model at the same ``routing.max_in_flight``.
Requests are streamed completions of ``--tokens`` tokens. Printed, for the fair queue and for
the queue turned off (a 503 at once when full, as before it):

- ``quiet``'s time to first token, p50 and p99, alone and beside ``flood`` running
  ``--flood`` × slots streams, and the errors each got;
- the engine's busy share (slots held over slots, sampled) while flooded;
- Jain's fairness index of the flood/quiet scenario, each tenant's tokens/s over its max-min
  fair share (quiet demands one slot, flood the rest);
- the token split of two equal tenants flooding together, and of weights 3 and 1.

With ``--overhead``, instead: what the slots cost a model that is never full. The same
closed-loop streams (``--streams``) run through a model without ``max_in_flight`` (no slots)
and through one whose ``max_in_flight`` is never reached (every request takes its slot on the
fast path), the engine's batch large enough for all; printed are tokens/s and TTFT p50 of
each, and the fast path's own cost (take and give back a slot) in a loop.

    python -m tests.benchmarks.fairness
    python -m tests.benchmarks.fairness --slots 16 --flood 6 --seconds 8
    python -m tests.benchmarks.fairness --overhead --streams 1,16,64
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from deploy.sidecar.models import ensure_tiny_model
from gateway.queueing.gate import ModelSlots
from gateway.queueing.scheduler import Flow
from gateway.queueing.settings import QueueSettings
from gateway.tenancy import TenantPolicy
from tests.support.paced_stack import (
    Answer,
    Stack,
    completion,
    flood,
    paced_gateway,
    paced_sidecar,
    stream_one,
)

TENANTS = {
    policy.name: policy
    for policy in (
        TenantPolicy(name="quiet"),
        TenantPolicy(name="flood"),
        TenantPolicy(name="even-a"),
        TenantPolicy(name="even-b"),
        TenantPolicy(name="heavy", weight=3.0),
        TenantPolicy(name="light"),
    )
}


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when every value is equal, 1/n when one takes everything."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


async def _quiet_alone(
    client: httpx.AsyncClient, stack: Stack, body: dict[str, Any], n: int
) -> list[Answer]:
    return [await stream_one(client, stack, "quiet", body) for _ in range(n)]


async def _flooded(
    client: httpx.AsyncClient, stack: Stack, body: dict[str, Any], args: argparse.Namespace
) -> tuple[list[Answer], list[Answer], float, float]:
    """Quiet's answers, flood's, the busy share and the seconds measured."""
    until = asyncio.Event()
    flooded: list[Answer] = []
    busy: list[float] = []
    running = asyncio.create_task(
        flood(client, stack, "flood", body, streams=args.flood * args.slots, until=until,
              answers=flooded)
    )  # fmt: skip
    await asyncio.sleep(1.0)
    slots = stack.slots()

    async def sample() -> None:
        while not until.is_set():
            busy.append(min(slots.in_flight, args.slots) / args.slots)
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    start = time.monotonic()
    quiet: list[Answer] = []
    while time.monotonic() - start < args.seconds:
        quiet.append(await stream_one(client, stack, "quiet", body))
    elapsed = time.monotonic() - start
    until.set()
    await asyncio.gather(running, sampler)
    window = [a for a in flooded if start <= a.ended <= start + elapsed]
    return quiet, window, statistics.mean(busy), elapsed


async def _split(
    client: httpx.AsyncClient,
    stack: Stack,
    tenants: tuple[str, str],
    body: dict[str, Any],
    seconds: float,
    streams: int,
) -> Counter[str]:
    until = asyncio.Event()
    answers: list[Answer] = []
    running = asyncio.gather(
        *(flood(client, stack, t, body, streams=streams, until=until, answers=answers)
          for t in tenants)
    )  # fmt: skip
    await asyncio.sleep(1.0)
    start = time.monotonic()
    await asyncio.sleep(seconds)
    end = time.monotonic()
    until.set()
    await running
    return Counter(a.tenant for a in answers if start <= a.ended <= end and a.status == 200)


def _ms(values: list[float]) -> str:
    p50, p99 = statistics.median(values), _percentile(values, 0.99)
    return f"p50 {1000 * p50:7.1f} ms  p99 {1000 * p99:7.1f} ms"


async def run(stack: Stack, args: argparse.Namespace, mode: str) -> None:
    body = completion(args.tokens)
    async with httpx.AsyncClient(base_url=stack.url, timeout=300, limits=httpx.Limits()) as client:
        await _quiet_alone(client, stack, body, 3)
        solo = await _quiet_alone(client, stack, body, args.solo)
        quiet, flooded, busy, elapsed = await _flooded(client, stack, body, args)
        ok = [a for a in quiet if a.status == 200]
        print(f"[{mode}] quiet alone   TTFT {_ms([a.ttft for a in solo])}")
        if ok:
            print(f"[{mode}] quiet flooded TTFT {_ms([a.ttft for a in ok])}")
        errors = Counter(a.status for a in quiet if a.status != 200)
        flood_errors = Counter(a.status for a in flooded if a.status != 200)
        print(f"[{mode}] quiet: {len(ok)} answered, errors {dict(errors)}; "
              f"flood: {sum(a.status == 200 for a in flooded)} answered, errors "
              f"{dict(flood_errors)}")  # fmt: skip
        print(f"[{mode}] engine busy share while flooded: {busy:.1%}")
        rates = {
            "quiet": len(ok) * args.tokens / elapsed,
            "flood": sum(a.status == 200 for a in flooded) * args.tokens / elapsed,
        }
        per_slot = 1 / (args.tokens * args.token_s)  # requests/s one slot can serve
        fair = {"quiet": min(1.0, args.slots / 2), "flood": args.slots - min(1.0, args.slots / 2)}
        # Quiet sends one request at a time: its demand is one slot less its own round trips.
        shares = [rates[t] / (fair[t] * per_slot * args.tokens) for t in ("quiet", "flood")]
        print(f"[{mode}] tokens/s quiet {rates['quiet']:.0f} flood {rates['flood']:.0f}; "
              f"Jain's index {jain(shares):.3f}")  # fmt: skip
        if mode == "fair":
            streams = 3 * args.slots
            even = await _split(client, stack, ("even-a", "even-b"), body, args.seconds, streams)
            print(f"[{mode}] equal floods: {dict(even)} ratio "
                  f"{even['even-a'] / max(even['even-b'], 1):.3f} (1.0)")  # fmt: skip
            weighted = await _split(client, stack, ("heavy", "light"), body, args.seconds, streams)
            print(f"[{mode}] weights 3:1: {dict(weighted)} ratio "
                  f"{weighted['heavy'] / max(weighted['light'], 1):.3f} (3.0)")  # fmt: skip


async def _closed_loop(
    stack: Stack, body: dict[str, Any], streams: int, seconds: float
) -> tuple[float, float]:
    """Tokens/s and TTFT p50 of ``streams`` closed loops over ``seconds``."""
    until = asyncio.Event()
    answers: list[Answer] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=stack.url, timeout=300, limits=limits) as client:
        running = asyncio.create_task(
            flood(client, stack, "quiet", body, streams=streams, until=until, answers=answers)
        )
        await asyncio.sleep(1.0)
        start = time.monotonic()
        await asyncio.sleep(seconds)
        end = time.monotonic()
        until.set()
        await running
    done = [a for a in answers if start <= a.ended <= end and a.status == 200]
    ttft = statistics.median(a.ttft for a in done if start <= a.started)
    return len(done) * body["max_tokens"] / (end - start), ttft


def fast_path_cost() -> float:
    """Seconds one slot taken and given back costs on the fast path."""
    slots = ModelSlots("m", lambda: 1_000_000, QueueSettings())
    flow = Flow("quiet")
    rounds = 200_000
    start = time.perf_counter()
    for _ in range(rounds):
        slot = slots.try_acquire(flow, 100)
        assert slot is not None
        slots.release(slot, 100)
    return (time.perf_counter() - start) / rounds


def overhead(args: argparse.Namespace, sidecar: Any, tokenizer: Path) -> None:
    body = completion(args.tokens)
    levels = [int(level) for level in args.streams.split(",")]
    print(f"fast path: take and give back a slot {fast_path_cost() * 1e9:.0f} ns")
    modes = (("no slots", None), ("slots, never full", 1_000_000))
    runs: dict[str, list[list[tuple[float, float]]]] = {mode: [] for mode, _ in modes}
    # Alternated, rounds apart: on a shared host the later of two runs is often the slower.
    for _ in range(args.rounds):
        for mode, limit in modes:
            with paced_gateway(sidecar, tokenizer, TENANTS, max_in_flight=limit) as stack:
                figures = [_closed_loop(stack, body, level, args.seconds) for level in levels]
                runs[mode].append([asyncio.run(figure) for figure in figures])
    for index, level in enumerate(levels):
        (base_rate, base_ttft), (rate, ttft) = (
            (
                statistics.median(run[index][0] for run in runs[mode]),
                statistics.median(run[index][1] for run in runs[mode]),
            )
            for mode, _ in modes
        )
        print(
            f"{level:4d} streams: no slots {base_rate:8.0f} tok/s TTFT p50 "
            f"{1000 * base_ttft:6.1f} ms | slots {rate:8.0f} tok/s ({rate / base_rate:.1%}) "
            f"TTFT p50 {1000 * ttft:6.1f} ms ({1000 * (ttft - base_ttft):+.1f} ms)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=4, help="engine batch = max_in_flight")
    parser.add_argument("--flood", type=int, default=6, help="flood streams per slot")
    parser.add_argument("--tokens", type=int, default=20, help="tokens per request")
    parser.add_argument("--token-s", type=float, default=0.01, help="seconds per token")
    parser.add_argument("--seconds", type=float, default=6.0, help="each measured phase")
    parser.add_argument("--solo", type=int, default=20, help="quiet's requests alone")
    parser.add_argument("--overhead", action="store_true", help="the slots' cost uncontended")
    parser.add_argument("--streams", default="1,16,64", help="--overhead's concurrencies")
    parser.add_argument("--rounds", type=int, default=3, help="--overhead's alternations")
    args = parser.parse_args()
    tokenizer = ensure_tiny_model()
    if args.overhead:
        with (
            tempfile.TemporaryDirectory() as workdir,
            paced_sidecar(tokenizer, Path(workdir), token_s=args.token_s, batch=4096) as sidecar,
        ):
            overhead(args, sidecar, tokenizer)
        return
    with (
        tempfile.TemporaryDirectory() as workdir,
        paced_sidecar(tokenizer, Path(workdir), token_s=args.token_s, batch=args.slots) as sidecar,
    ):
        for mode, queueing in (
            ("fair", QueueSettings(half_life_s=10.0)),
            ("off", QueueSettings(enabled=False)),
        ):
            with paced_gateway(
                sidecar, tokenizer, TENANTS, max_in_flight=args.slots, queueing=queueing
            ) as stack:
                asyncio.run(run(stack, args, mode))


if __name__ == "__main__":
    main()
