"""A tenant's latency while another sends deep JSON schemas, each a fresh grammar to compile.

Serves the tiny model (or SmolLM2) through the gateway with two tenants. ``team-a``, the
victim, asks one short chat completion after another; its p50 latency is measured alone, then
while ``team-b`` sends ``response_format`` json_schema objects nested ``--depth`` deep, each
with fresh property names (no cache holds them), from ``--attackers`` clients for
``--attack-s`` seconds:

    python -m tests.benchmarks.hostile.grammar [--model tiny|smollm2] [--depth 300]
        [--attack-s 15] [--compile-timeout-ms N] [--max-compiles N]

Prints the figures; nothing is asserted.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import openai

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.models import ensure_smollm2, ensure_tiny_model
from deploy.sidecar.spec import parse_spec
from gateway.tenancy import KeyEntry, StoreSettings, TenancySettings, TenantPolicy
from gateway.tenancy.keys import digest, new_key
from tests.support.gateway import LiveGateway, sidecar_settings
from tests.support.schemas import nested_schema
from tests.support.sidecars import QUICK_STOP

MODEL = "bench"
ASK = [{"role": "user", "content": "Say hello."}]
VICTIM_TOKENS = 4
ATTACK_TOKENS = 33


@dataclass
class Attack:
    """What the attacker's requests got: status counts and latencies."""

    outcomes: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, outcome: str, seconds: float) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            self.latencies.append(seconds)


def victim_latencies(client: openai.OpenAI, seconds: float, every_s: float) -> list[float]:
    """Latencies of requests sent every ``every_s`` for ``seconds``, whether or not the earlier
    ones were answered (a stalled engine shows in every request that waits on it)."""

    def one() -> float:
        started = time.perf_counter()
        client.chat.completions.create(
            model=MODEL,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=VICTIM_TOKENS,
            temperature=0.0,
        )
        return time.perf_counter() - started

    count = max(1, int(seconds / every_s))
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=count) as pool:
        futures = []
        for index in range(count):
            time.sleep(max(0.0, start + index * every_s - time.monotonic()))
            futures.append(pool.submit(one))
        return [future.result() for future in futures]


def attacker(client: openai.OpenAI, depth: int, until: float, tags: Any, attack: Attack) -> None:
    while time.monotonic() < until:
        schema = nested_schema(depth, f"p{next(tags)}")
        body = {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}}
        started = time.perf_counter()
        try:
            client.chat.completions.create(
                model=MODEL,
                messages=ASK,  # type: ignore[arg-type]
                max_tokens=ATTACK_TOKENS,
                extra_body={"response_format": body},
            )
            outcome = "200"
        except openai.APIStatusError as exc:
            outcome = str(exc.status_code)
        except openai.APIError as exc:
            outcome = type(exc).__name__
        attack.record(outcome, time.perf_counter() - started)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def spec_of(args: argparse.Namespace) -> Any:
    model_dir = ensure_smollm2() if args.model == "smollm2" else ensure_tiny_model()
    engine: dict[str, Any] = {"kind": "torch", "model_dir": str(model_dir), "max_batch_size": 8}
    if args.compile_timeout_ms is not None:
        engine["guided_decoding_compile_timeout_ms"] = args.compile_timeout_ms
    if args.max_compiles is not None:
        engine["guided_decoding_max_compiles"] = args.max_compiles
    spec = parse_spec(
        {
            "models": [{"name": MODEL, "release": "latest", "engine": engine}],
            "sidecars": [{"name": "hostile", **QUICK_STOP}],
        }
    )
    return spec, model_dir


def run(args: argparse.Namespace) -> None:
    # The attacker's 400s are expected: the gateway's warning for each is not a figure.
    logging.getLogger("gateway").setLevel(logging.ERROR)
    spec, model_dir = spec_of(args)
    keys = {"team-a": new_key(), "team-b": new_key()}
    tenancy = TenancySettings(
        tenants=tuple(TenantPolicy(name=name) for name in keys),
        keys=tuple(KeyEntry(tenant=name, sha256=digest(key)) for name, key in keys.items()),
        store=StoreSettings(kind="memory"),
    )
    with tempfile.TemporaryDirectory() as workdir:
        sidecar = sidecar_from_spec(spec, spec.sidecars[0], Path(workdir))
        sidecar.start()
        settings = sidecar_settings(
            sidecar, model_dir, models={MODEL: (f"{MODEL}_ensemble", "ensemble")}
        )
        gateway = LiveGateway(msgspec.structs.replace(settings, tenancy=tenancy)).start()
        try:
            measure(gateway.url, keys, args)
        finally:
            gateway.stop()
            sidecar.stop()


def measure(url: str, keys: dict[str, str], args: argparse.Namespace) -> None:
    def client(tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url}/v1", api_key=keys[tenant], max_retries=0, timeout=600)

    victim = client("team-a")
    victim_latencies(victim, 1.0, args.every_s)  # warm-up
    quiet = victim_latencies(victim, args.quiet_s, args.every_s)
    attack = Attack()
    until = time.monotonic() + args.attack_s
    tags = itertools.count()
    threads = [
        threading.Thread(target=attacker, args=(client("team-b"), args.depth, until, tags, attack))
        for _ in range(args.attackers)
    ]
    for thread in threads:
        thread.start()
    loaded = victim_latencies(victim, args.attack_s, args.every_s)
    for thread in threads:
        thread.join()
    quiet_p50 = statistics.median(quiet)
    loaded_p50 = statistics.median(loaded)
    print(
        f"model {args.model}, schema depth {args.depth}, {args.attackers} attacker clients, "
        f"a victim request every {args.every_s} s"
    )
    print(f"victim quiet:        p50 {quiet_p50:.3f} s  p90 {percentile(quiet, 0.9):.3f} s  "
          f"({len(quiet)} requests)")  # fmt: skip
    print(f"victim under attack: p50 {loaded_p50:.3f} s  p90 {percentile(loaded, 0.9):.3f} s  "
          f"max {max(loaded):.3f} s  ({len(loaded)} requests)")  # fmt: skip
    print(f"victim p50 under attack / quiet: {loaded_p50 / quiet_p50:.1f}x")
    outcomes = ", ".join(f"{code}: {count}" for code, count in sorted(attack.outcomes.items()))
    attack_p50 = statistics.median(attack.latencies) if attack.latencies else float("nan")
    print(f"attacker requests: {len(attack.latencies)} ({outcomes}), p50 {attack_p50:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--depth", type=int, default=300)
    parser.add_argument("--attackers", type=int, default=2)
    parser.add_argument("--quiet-s", type=float, default=8.0)
    parser.add_argument("--every-s", type=float, default=0.25)
    parser.add_argument("--attack-s", type=float, default=15.0)
    parser.add_argument("--compile-timeout-ms", type=int)
    parser.add_argument("--max-compiles", type=int)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
