"""Routing over replicas, measured: a policy against round robin on the same tritonservers.

    python -m tests.benchmarks.replicas [--workload prefix|adapter|both] [--replicas 4]
        [--policy score --policy round_robin] [--engine-option KEY=VALUE ...] [--out DIR]

It starts ``--replicas`` tritonservers on loopback (the tiny model on the torch engine by
default, ``--model-dir`` for another; only the engine model loaded, the gateway's
``tensorrt_llm`` entry), then for each policy an in-process gateway over them, and drives one
workload per gateway (``tests/benchmarks/replica_workloads.py``):

- ``prefix``: streamed chat requests sharing long system prompts (``--groups`` of them, each
  ``--prefix-tokens`` words), a distinct question each. Reported: time to first token p50/p90,
  completion tokens/s, the engines' KV-cache hit rate (reused blocks over the prompts' full
  blocks, from ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused"}``), the
  gateway's prefix hits and the spread over replicas. The hit rate needs an engine that reuses
  prefixes (``--engine-option`` passes the engine's own switch); one that reports no reuse gives
  0 and then the times compare routing overhead and balance only.
- ``adapter``: completions spread evenly over ``--adapters`` LoRA adapters, each engine's LoRA
  cache holding ``--lora-cache``. Reported: LoRA cache misses per 1,000 requests, the requests
  that had to carry the adapter's weights: a replica's first request for it, and every resend
  after the engine answered that it had evicted it (``gateway_replica_adapter_loads_total``).

Each policy's run uses prompts of its own (a fresh seed), so caches warmed by one run do not
help the next. The report says which signals the engines published. Written to ``--out``
(default ``.bench/results``, untracked) as ``bench-replicas.{md,json}`` and printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import msgspec

from deploy.sidecar.models import ensure_tiny_model
from deploy.sidecar.supervisor import Sidecar
from gateway.replicas.settings import EndpointSettings, RoutingSettings
from gateway.settings import AdapterSettings, LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.benchmarks.replica_workloads import MODEL, Run, adapter_workload, prefix_workload
from tests.support import REPO
from tests.support.gateway import LiveGateway
from tests.support.replicas import ENGINE_MODEL, start_replicas, stop_replicas

RESULTS = REPO / ".bench" / "results"
"""Where reports go by default: untracked; ``--out tests/benchmarks/results`` updates the
committed ones."""
BLOCK = re.compile(
    r'^nv_trt_llm_kv_cache_block_metrics\{kv_cache_block_type="(?P<kind>\w+)",model="'
    + ENGINE_MODEL
    + r'"[^}]*\} (?P<value>\S+)$',
    re.MULTILINE,
)
COUNTER = re.compile(r"^(gateway_replica_\w+_total)\{([^}]*)\} (\S+)$", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')
SCORE_INPUTS = ("waiting_requests", "scheduled_requests", "kv_cache_utilization")


def engine_blocks(sidecars: Sequence[Sidecar]) -> dict[str, float]:
    """The engines' KV-cache block figures, by ``kv_cache_block_type``, summed over replicas."""
    totals: dict[str, float] = {}
    for sidecar in sidecars:
        for match in BLOCK.finditer(httpx.get(sidecar.metrics_url, timeout=5).text):
            totals[match["kind"]] = totals.get(match["kind"], 0.0) + float(match["value"])
    return totals


def gateway_counters(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """The ``gateway_replica_*_total`` counters summed over replicas (keyed ``name:reason``
    where they have a reason), and the requests routed to each replica."""
    totals: dict[str, float] = {}
    routed: dict[str, float] = {}
    for name, labels, value in COUNTER.findall(text):
        found = dict(LABEL.findall(labels))
        key = f"{name}:{found['reason']}" if "reason" in found else name
        totals[key] = totals.get(key, 0.0) + float(value)
        if name == "gateway_replica_requests_total":
            routed[found["replica"]] = routed.get(found["replica"], 0.0) + float(value)
    return totals, routed


def gateway_settings(
    args: argparse.Namespace,
    sidecars: Sequence[Sidecar],
    tokenizer_dir: str,
    policy: str,
    adapters: dict[str, Path],
) -> Settings:
    routing = RoutingSettings(
        policy=policy,  # type: ignore[arg-type]
        adapter_slots=args.lora_cache,
        probe_interval_s=0.5,
    )
    model = ModelSettings(
        name=MODEL,
        triton_model=ENGINE_MODEL,
        entry="tensorrt_llm",
        tokenizer_dir=tokenizer_dir,
        replicas=tuple(
            EndpointSettings(url=s.grpc_url, metrics_url=s.metrics_url, name=s.name)
            for s in sidecars
        ),
        routing=routing,
        adapters=tuple(AdapterSettings(name=n, path=str(p)) for n, p in adapters.items()),
    )
    return Settings(
        models=(model,),
        limits=LimitSettings(request_timeout_s=300.0, shutdown_grace_s=2.0),
        tenancy=TenancySettings(auth=False),
    )


class Bench:
    """The running replicas, and what was learnt of the signals they publish."""

    def __init__(self, args: argparse.Namespace, sidecars: list[Sidecar], tokenizer_dir: str):
        self.args = args
        self.sidecars = sidecars
        self.tokenizer_dir = tokenizer_dir
        self.adapters: dict[str, Path] = {}
        self.blocks_published: set[str] = set()
        self.score_inputs_seen: set[str] = set()

    def measure(self, workload: str, policy: str, seed: int) -> Run:
        """One gateway with ``policy`` over the replicas, driven by ``workload``."""
        args = self.args
        settings = gateway_settings(args, self.sidecars, self.tokenizer_dir, policy, self.adapters)
        gateway = LiveGateway(settings).start()
        run = Run(policy)
        try:
            deadline = time.monotonic() + 60
            while httpx.get(f"{gateway.url}/health/ready", timeout=5).status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError("the gateway did not become ready")
                time.sleep(0.2)
            before = engine_blocks(self.sidecars)
            drive = prefix_workload if workload == "prefix" else adapter_workload
            asyncio.run(drive(gateway.url, args, seed, run))
            time.sleep(1.5)  # the engines publish their statistics every second
            after = engine_blocks(self.sidecars)
            self.blocks_published |= after.keys()
            if "reused" in after:
                run.reused_blocks = after["reused"] - before.get("reused", 0.0)
            text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
            run.counters, run.per_replica = gateway_counters(text)
            self.score_inputs_seen |= {k for k in SCORE_INPUTS if f"gateway_replica_{k}{{" in text}
        finally:
            gateway.stop()
        print(f"{workload:8} {policy:13} {summary(run, workload)}", flush=True)
        return run

    def signals(self, runs: dict[str, list[Run]]) -> list[str]:
        """What the engines published that the figures rest on, one line each."""
        reused = [r.reused_blocks for rs in runs.values() for r in rs if r.reused_blocks]
        if "reused" not in self.blocks_published:
            kv = "not published by the engines: no KV-cache hit rate"
        elif not reused:
            kv = "published, and 0 in every run: the engines reused no prefix (no KV reuse)"
        else:
            kv = "published and counting: the hit rate is the engines' own"
        block = "tokens_per" in self.blocks_published
        inputs = ", ".join(sorted(self.score_inputs_seen)) or "none"
        return [
            f'- KV-cache reuse (`kv_cache_block_type="reused"`): {kv}',
            f"- KV block size (`tokens_per`): {'published' if block else 'not published'}, "
            f"{self.args.block_tokens} tokens a block",
            f"- Score inputs scraped by the gateway: {inputs}",
            "- LoRA cache misses: counted by the gateway (a replica's first request for an "
            "adapter, and resends after the engine answered that it had evicted it); the "
            "engines publish no LoRA cache metrics",
            "- TTFT and tokens/s: measured by the client, through the gateway",
        ]


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{1e3 * value:.1f} ms"


def summary(run: Run, workload: str) -> str:
    spread = _spread(run)
    if workload == "adapter":
        return (
            f"{run.lora_misses_per_1000:7.1f} LoRA misses / 1000 requests, "
            f"{run.tokens_per_s:7.1f} tok/s, max/min routed {spread}, errors {run.errors}"
        )
    return (
        f"TTFT p50 {_ms(run.percentile(0.5))} p90 {_ms(run.percentile(0.9))}, "
        f"{run.tokens_per_s:7.1f} tok/s, KV hit rate {_pct(run.hit_rate)}, "
        f"gateway prefix hits {run.gateway_prefix_hits:.1%}, max/min routed {spread}, "
        f"errors {run.errors}"
    )


def report(args: argparse.Namespace, runs: dict[str, list[Run]], signals: list[str]) -> str:
    lines = [
        "# Routing over replicas",
        "",
        f"{args.replicas} tritonservers on loopback ({args.model_dir or 'the tiny model'} on "
        f"the torch engine, engine options {args.engine_option or 'none'}, engine batch "
        f"{args.max_batch_size}), one in-process gateway per policy, concurrency "
        f"{args.concurrency}, {args.requests} requests per run; {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()}) shared by the servers, the gateway and "
        f"the clients; {time.strftime('%Y-%m-%d')}.",
        "",
        "Signals:",
        "",
        *signals,
        "",
    ]
    if "prefix" in runs:
        lines += [
            f"## Shared-prefix chat: {args.groups} system prompts of {args.prefix_tokens} "
            f"words, {args.max_tokens} tokens per answer, streamed",
            "",
            "| policy | TTFT p50 | TTFT p90 | completion tokens/s | KV-cache hit rate | "
            "gateway prefix hits | max/min routed | errors |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for run in runs["prefix"]:
            lines.append(
                f"| {run.policy} | {_ms(run.percentile(0.5))} | {_ms(run.percentile(0.9))} | "
                f"{run.tokens_per_s:,.1f} | {_pct(run.hit_rate)} | "
                f"{run.gateway_prefix_hits:.1%} | {_spread(run)} | {run.errors} |"
            )
        lines.append("")
    if "adapter" in runs:
        lines += [
            f"## Adapters: {args.adapters} LoRA adapters, an engine LoRA cache of "
            f"{args.lora_cache} per replica, {args.max_tokens} tokens per answer",
            "",
            "| policy | LoRA cache misses per 1,000 requests | first loads | reloads after "
            "eviction | gateway adapter hits | completion tokens/s | max/min routed | errors |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for run in runs["adapter"]:
            first = run.counters.get("gateway_replica_adapter_loads_total:first", 0.0)
            evicted = run.counters.get("gateway_replica_adapter_loads_total:evicted", 0.0)
            hits = run.counters.get("gateway_replica_adapter_hits_total", 0.0)
            lines.append(
                f"| {run.policy} | {run.lora_misses_per_1000:.1f} | {first:.0f} | "
                f"{evicted:.0f} | {hits / max(run.requests, 1):.1%} | "
                f"{run.tokens_per_s:,.1f} | {_spread(run)} | {run.errors} |"
            )
        lines.append("")
    return "\n".join(lines)


def _spread(run: Run) -> str:
    return "n/a" if run.imbalance is None else f"{run.imbalance:.2f}"


def _option(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    return key, msgspec.yaml.decode(value.encode()) if value else True


def make_adapters(model_dir: Path, root: Path, count: int) -> dict[str, Path]:
    from tests.support.lora import ALL_MODULES, AdapterRecipe, make_peft_adapter

    return {
        f"adapter-{i}": make_peft_adapter(
            model_dir, root / f"adapter-{i}", AdapterRecipe(4, 8, ALL_MODULES, seed=100 + i)
        )
        for i in range(count)
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--workload", choices=["prefix", "adapter", "both"], default="both")
    parser.add_argument(
        "--policy", action="append", choices=["score", "least_request", "round_robin"]
    )
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--model-dir", help="a Hugging Face model folder; default: tiny")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--engine-option", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--block-tokens", type=int, default=64, help="the engines' KV block size")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--lora-cache", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the report")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    policies = args.policy or ["score", "round_robin"]
    workloads = ["prefix", "adapter"] if args.workload == "both" else [args.workload]
    hosts = [f"127.0.0.{i + 1}" for i in range(args.replicas)]
    options = dict(_option(o) for o in args.engine_option)
    runs: dict[str, list[Run]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        work = Path(tmp)
        model_dir = Path(args.model_dir) if args.model_dir else ensure_tiny_model()
        sidecars = start_replicas(
            model_dir,
            work,
            hosts,
            [args.max_batch_size] * args.replicas,
            lora_cache_size=args.lora_cache,
            engine_options=options,
        )
        try:
            bench = Bench(args, sidecars, str(model_dir))
            if "adapter" in workloads:
                bench.adapters = make_adapters(model_dir, work / "adapters", args.adapters)
            args.block_tokens = int(engine_blocks(sidecars[:1]).get("tokens_per", 0)) or (
                args.block_tokens
            )
            for workload in workloads:
                for seed, policy in enumerate(policies):
                    runs.setdefault(workload, []).append(bench.measure(workload, policy, seed))
            signals = bench.signals(runs)
        finally:
            stop_replicas(sidecars)
    text = report(args, runs, signals)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    meta |= {"cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "signals": signals}
    results = {w: [asdict(r) for r in rs] for w, rs in runs.items()}
    (args.out / "bench-replicas.json").write_text(
        json.dumps({"meta": meta, "runs": results}, indent=1)
    )
    (args.out / "bench-replicas.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
