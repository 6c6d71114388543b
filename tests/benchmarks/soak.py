"""Soak: many concurrent streams against ``triton-gateway serve`` on the tiny model.

``python -m tests.benchmarks.soak`` starts the gateway with a local sidecar (the demo's shape:
in-memory limits, auth off) and keeps ``--streams`` streaming completions going for ``--duration``
seconds. It prints errors, throughput, and the gateway's RSS and open file descriptors sampled
every few seconds: RSS growth is measured from ``--baseline`` seconds (after warm-up) to the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from deploy.sidecar.models import ensure_tiny_model
from tests.support.gateway import serve_process, stop_process


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


async def _client(url: str, until: float, tokens: int, outcomes: Counter[str]) -> int:
    body = {
        "model": "tiny",
        "prompt": "def soak(x):",
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    generated = 0
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        while time.monotonic() < until:
            try:
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        outcomes[f"http {response.status_code}"] += 1
                        await response.aread()
                        continue
                    done = False
                    async for line in response.aiter_lines():
                        if line == "data: [DONE]":
                            done = True
                        elif line.startswith("data: "):
                            chunk = json.loads(line[6:])
                            if "error" in chunk:
                                outcomes["stream error"] += 1
                            elif chunk.get("usage"):
                                generated += chunk["usage"]["completion_tokens"]
                    outcomes["ok" if done else "unterminated"] += 1
            except httpx.HTTPError as exc:
                outcomes[type(exc).__name__] += 1
    return generated


async def _sample(pid: int, start: float, until: float, every: float) -> list[dict[str, float]]:
    samples = []
    while time.monotonic() < until:
        samples.append({"t": time.monotonic() - start, "rss_mib": _rss_mib(pid), "fds": _fds(pid)})
        await asyncio.sleep(every)
    samples.append({"t": time.monotonic() - start, "rss_mib": _rss_mib(pid), "fds": _fds(pid)})
    return samples


async def _load(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    start = time.monotonic()
    until = start + args.duration
    sampler = asyncio.create_task(_sample(pid, start, until, args.every))
    generated = await asyncio.gather(
        *(_client(url, until, args.tokens, outcomes) for _ in range(args.streams))
    )
    wall = time.monotonic() - start
    samples = await sampler
    return {
        "outcomes": dict(outcomes),
        "tokens": sum(generated),
        "wall_s": wall,
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument(
        "--baseline", type=float, default=60.0, help="seconds before RSS is compared"
    )
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--every", type=float, default=5.0)
    args = parser.parse_args(argv)
    engine = {"kind": "torch", "model_dir": str(ensure_tiny_model()), "max_batch_size": 64}
    config = {
        "sidecars": {"inline": {"models": [{"name": "tiny", "engine": engine}]}},
        "tenancy": {"auth": False},
        "observability": {"log_format": "json"},
        "log_level": "WARNING",
    }
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    url, process = serve_process(config, workdir, "soak", timeout_s=180)
    try:
        report = asyncio.run(_load(url, process.pid, args))
    finally:
        stop_process(process)
    samples = report["samples"]
    base = next(s for s in samples if s["t"] >= args.baseline - args.every / 2)
    last = samples[-1]
    errors = sum(n for kind, n in report["outcomes"].items() if kind != "ok")
    print(
        f"{args.streams} concurrent streams for {report['wall_s']:.0f} s, {args.tokens} tokens each"
    )
    print(f"  outcomes: {report['outcomes']}  (errors: {errors})")
    print(
        f"  requests/s: {report['outcomes'].get('ok', 0) / report['wall_s']:.1f}; "
        f"tokens/s: {report['tokens'] / report['wall_s']:.0f}"
    )
    print(
        f"  gateway RSS: {samples[0]['rss_mib']:.0f} MiB at start, {base['rss_mib']:.0f} MiB at "
        f"{base['t']:.0f} s, {last['rss_mib']:.0f} MiB at the end: "
        f"{(last['rss_mib'] / base['rss_mib'] - 1) * 100:+.1f}% from {base['t']:.0f} s"
    )
    print(
        f"  open files: {samples[0]['fds']} at start, {base['fds']} at {base['t']:.0f} s, "
        f"{last['fds']} at the end"
    )
    print(
        "  samples (s, MiB, fds): "
        + ", ".join(f"({s['t']:.0f}, {s['rss_mib']:.0f}, {s['fds']})" for s in samples)
    )
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
