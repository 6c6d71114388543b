"""The capacity benchmark's load: the load-generator processes' work (``client_main``, over
raw HTTP/1.1 or Triton's gRPC), and one target measured at one level from their samples and
the CPU of the process trees (``measure``, a ``Row``)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import time
from dataclasses import dataclass
from typing import Any

from adapters.triton.grpc.stream import Channels
from tests.benchmarks.capacity_setup import KEY
from tests.benchmarks.loadgen import H2StreamClient, HttpClient, Sample, has_output_ids, run_level
from tests.benchmarks.serving import cpu_seconds


@dataclass(frozen=True)
class Row:
    """One target at one level."""

    target: str
    endpoint: str
    streams: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    requests: int
    errors: int
    first_error: str | None
    cpu: dict[str, float]
    """Cores used by each process tree during the level."""
    round: int = 0
    """Which of the ``--rounds`` (each measures every target at every level)."""


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


Result = tuple[float, float, float, int, list[float], str | None, bool]
"""A request: start, first token, end, tokens, gaps between tokens, error, whether a ramp."""


def _arrivals(result: Result, since: float, until: float) -> int:
    """How many of a request's tokens arrived between ``since`` and ``until``."""
    if not result[3]:
        return 0
    times = itertools.accumulate(result[4], initial=result[1])
    return sum(1 for t in times if since <= t <= until)


def client_main(job: dict[str, Any]) -> tuple[list[Result], float]:
    """One load-generator process: ``job["streams"]`` clients for ``job["seconds"]``; its
    samples and the CPU seconds it spent."""

    async def run() -> list[Sample]:
        channels = Channels()

        async def connect() -> Any:
            if job.get("grpc"):
                url = f"{job['host']}:{job['port']}"
                return H2StreamClient(channels, url, job["message"]).send
            client = HttpClient(
                job["host"], job["port"], job["path"], job["body"], KEY,
                is_token=has_output_ids if job["direct"] else None,
                ends_with_done=not job["direct"],
            )  # fmt: skip
            return client.send

        # A stream that never ends is an error of its own, not a hung level.
        samples, _ = await run_level(
            connect, job["streams"], job["seconds"], job["stall_s"], job["stagger_s"], job["phase"],
            job["think_s"],
        )  # fmt: skip
        await channels.close()
        return samples

    cpu = time.process_time()
    samples = asyncio.run(run())
    cpu = time.process_time() - cpu
    return [(s.start, s.first, s.end, s.tokens, s.gaps, s.error, s.ramp) for s in samples], cpu


def spread(total: int, parts: int) -> list[int]:
    share = [total // parts] * parts
    for index in range(total % parts):
        share[index] += 1
    return [s for s in share if s]


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def measure(
    target: str,
    endpoint: str,
    url: str,
    job: dict[str, Any],
    streams: int,
    args: argparse.Namespace,
    trees: dict[str, int],
    round_: int = 0,
) -> Row:
    host, port = url.removeprefix("http://").split(":")
    shares = spread(streams, args.clients)
    stagger_s = args.tokens / args.rate if args.arrivals == "staggered" else 0.0
    jobs = [
        {**job, "host": host, "port": int(port), "streams": share, "seconds": args.seconds,
         "stagger_s": stagger_s, "phase": index / len(shares), "think_s": args.think_ms / 1e3,
         "stall_s": args.stall_s}
        for index, share in enumerate(shares)
    ]  # fmt: skip
    context = multiprocessing.get_context("spawn")
    with context.Pool(len(jobs)) as pool:
        warm = [{**j, "seconds": args.warmup, "stagger_s": 0.0} for j in jobs]
        pool.map(client_main, warm)
        before = _cpu(trees)
        started = time.perf_counter()
        results = pool.map(client_main, jobs)
        wall = time.perf_counter() - started
        after = _cpu(trees)
    # Tokens/s counts the tokens that arrived while every stream was sending; latencies leave
    # out each staggered stream's first request, sent while the others were still starting.
    window = (started + stagger_s, started + stagger_s + args.seconds)
    arrived = sum(_arrivals(s, *window) for part, _ in results for s in part if s[5] is None)
    every = [s for part, _ in results for s in part]
    # The paced engine sends every token asked for: an answer that ended with fewer lost some.
    short = [f"short: {s[3]} of {args.tokens} tokens" for s in every
             if s[5] is None and s[3] < args.tokens]  # fmt: skip
    good = [s for s in every if s[5] is None and not s[6] and s[3] >= args.tokens]
    errors = [s[5] for s in every if s[5] is not None] + short
    cpu = {name: (after[name] - before[name]) / wall for name in trees}
    cpu["load generator"] = sum(spent for _, spent in results) / wall
    gaps = [gap for s in good for gap in s[4]]
    row = Row(
        target=target,
        endpoint=endpoint,
        streams=streams,
        tokens_per_s=arrived / args.seconds,
        ttft_p50_ms=1e3 * _quantile([s[1] - s[0] for s in good], 0.5),
        ttft_p99_ms=1e3 * _quantile([s[1] - s[0] for s in good], 0.99),
        itl_p50_ms=1e3 * _quantile(gaps, 0.5),
        itl_p99_ms=1e3 * _quantile(gaps, 0.99),
        requests=len(good),
        errors=len(errors),
        first_error=errors[0] if errors else None,
        cpu=cpu,
        round=round_,
    )
    mark = f"#{round_} " if args.rounds > 1 else ""
    print(
        f"{mark}{target:10s} {endpoint:5s} {streams:5d} streams {row.tokens_per_s:9,.0f} tok/s "
        f"TTFT p50 {row.ttft_p50_ms:7.1f} ms ITL p50 {row.itl_p50_ms:6.2f} p99 "
        f"{row.itl_p99_ms:6.2f} ms errors {row.errors} cores "
        + " ".join(f"{k}={v:.1f}" for k, v in cpu.items()),
        flush=True,
    )
    return row
