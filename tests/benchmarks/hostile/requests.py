"""A hostile tenant's oversize requests against the starter's setup: what they cost the others.

Starts ``triton-gateway serve`` on a sidecar of SmolLM2 (or the tiny model) with the starter's two
tenants and limits, then measures the victim tenant's chat (4 tokens, one at a time, at most two a
second, within its limit) quiet, and while the attacker sends one oversize request after another,
as fast as they are answered, for ``--seconds``:

- ``/v1/completions`` with 200,000 one-character prompts;
- ``/v1/completions`` with 2,000 prompts and ``max_tokens: 1``;
- chats with 120,000 distinct ``stop`` strings.

Prints, for each: the victim's p50 latency (and its ratio to the quiet figure), the attacker's
answers by status and their median time, and the gateway process's RSS (before, and the most
seen during the attack):

    python -m tests.benchmarks.hostile.requests [--model smollm2|tiny] [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from deploy.sidecar.ports import free_port
from gateway.tenancy.keys import digest

TEAM_A = "tgw-hostile-a-0123456789abcdef0123456789abcdef"
TEAM_B = "tgw-hostile-b-0123456789abcdef0123456789abcdef"
REFILL_S = 60.0
"""A minute: team-b's request limit full again."""
VICTIM_INTERVAL_S = 0.5
"""The victim sends at most one request this often: team-a's 120 requests a minute."""
VICTIM = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}
ATTACKS: dict[str, tuple[str, dict[str, Any]]] = {
    "200,000 one-character prompts": (
        "/v1/completions",
        {"prompt": ["a"] * 200_000, "max_tokens": 1},
    ),
    "2,000 prompts, max_tokens 1": (
        "/v1/completions",
        {"prompt": [f"Tell me about {i}" for i in range(2000)], "max_tokens": 1},
    ),
    "120,000 distinct stop strings": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 4,
            "stop": [f"stop-{i}" for i in range(120_000)],
        },
    ),
}


def settings(model: str) -> dict[str, Any]:
    """The starter's gateway settings (``triton-gateway init``) on an inline sidecar spec."""
    engine = {"kind": "torch", "model_dir": model, "max_seq_len": 2048}
    tenants = [
        {
            "name": "team-a",
            "models": [model],
            "requests_per_minute": 120,
            "tokens_per_minute": 40000,
            "max_concurrency": 4,
            "max_tokens": 256,
        },
        {
            "name": "team-b",
            "models": [model],
            "requests_per_minute": 20,
            "tokens_per_minute": 5000,
        },
    ]
    keys = [
        {"tenant": "team-a", "sha256": digest(TEAM_A)},
        {"tenant": "team-b", "sha256": digest(TEAM_B)},
    ]
    return {
        "sidecars": {
            "inline": {
                "models": [{"name": model, "engine": engine}],
                "sidecars": [{"name": "hostile"}],
            }
        },
        "models": [{"name": model, "pipeline": model}],
        "tenancy": {"tenants": tenants, "keys": keys, "store": {"kind": "memory"}},
        "log_level": "WARNING",
    }


def rss_mb(pid: int) -> float:
    """Resident memory of one process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Window:
    """What one measuring window saw."""

    victim: list[float] = field(default_factory=list)
    victim_failures: int = 0
    attacker: list[tuple[int, float]] = field(default_factory=list)
    rss_peak_mb: float = 0.0


def victim_loop(url: str, model: str, until: float, window: Window, pid: int) -> None:
    body = json.dumps({"model": model, **VICTIM}).encode()
    headers = {"Authorization": f"Bearer {TEAM_A}", "Content-Type": "application/json"}
    with httpx.Client(base_url=url, timeout=120) as client:
        while time.monotonic() < until:
            started = time.perf_counter()
            answer = client.post("/v1/chat/completions", content=body, headers=headers)
            elapsed = time.perf_counter() - started
            if answer.status_code == 200:
                window.victim.append(elapsed)
            else:
                window.victim_failures += 1
            window.rss_peak_mb = max(window.rss_peak_mb, rss_mb(pid))
            # Within team-a's own limit (120 a minute), so every answer is a generation.
            time.sleep(max(0.0, started + VICTIM_INTERVAL_S - time.perf_counter()))


def attacker_loop(url: str, path: str, body: bytes, until: float, window: Window) -> None:
    headers = {"Authorization": f"Bearer {TEAM_B}", "Content-Type": "application/json"}
    with httpx.Client(base_url=url, timeout=300) as client:
        while time.monotonic() < until:
            started = time.perf_counter()
            answer = client.post(path, content=body, headers=headers)
            window.attacker.append((answer.status_code, time.perf_counter() - started))


def measure(
    url: str, model: str, pid: int, seconds: float, attack: tuple[str, bytes] | None
) -> Window:
    window = Window(rss_peak_mb=rss_mb(pid))
    until = time.monotonic() + seconds
    threads = [threading.Thread(target=victim_loop, args=(url, model, until, window, pid))]
    if attack is not None:
        path, body = attack
        attacker = (url, path, body, until, window)
        threads.append(threading.Thread(target=attacker_loop, args=attacker))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return window


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"triton-gateway serve exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("the gateway did not become ready")


def report(name: str, window: Window, quiet_p50: float | None, rss_before: float) -> None:
    p50 = statistics.median(window.victim) if window.victim else float("nan")
    ratio = f" ({p50 / quiet_p50:.1f}x quiet)" if quiet_p50 else ""
    line = f"{name:32} victim p50 {p50:6.3f} s{ratio}, {len(window.victim)} answers"
    if window.victim_failures:
        line += f", {window.victim_failures} failed"
    if window.attacker:
        statuses = Counter(status for status, _ in window.attacker)
        answered = statistics.median(seconds for _, seconds in window.attacker)
        refused = [seconds for status, seconds in window.attacker if status == 400]
        if refused:
            line += f"; attacker's 400s answered in {statistics.median(refused) * 1000:.0f} ms"
        first_429 = next(
            (i + 1 for i, (status, _) in enumerate(window.attacker) if status == 429), None
        )
        line += (
            f"; attacker {dict(sorted(statuses.items()))}, all answered in "
            f"{answered * 1000:.0f} ms (median)"
            f", first 429 at request {first_429}"
        )
    line += f"; gateway RSS {rss_before:.0f} -> peak {window.rss_peak_mb:.0f} MB"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--quiet-seconds", type=float, default=8.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hostile-") as folder:
        config = Path(folder) / "gateway.yaml"
        config.write_text(json.dumps(settings(args.model)))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        serve = Path(sys.executable).parent / "triton-gateway"
        command = [str(serve), "serve", "--config", str(config)]
        log = (Path(folder) / "serve.log").open("wb")
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        process = subprocess.Popen(
            [*command, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        try:
            wait_ready(url, process)
            measure(url, args.model, process.pid, 2.0, None)  # warm up
            rss_start = rss_mb(process.pid)
            quiet = measure(url, args.model, process.pid, args.quiet_seconds, None)
            report("quiet", quiet, None, rss_start)
            quiet_p50 = statistics.median(quiet.victim)
            for name, (path, body) in ATTACKS.items():
                if name != next(iter(ATTACKS)):
                    time.sleep(REFILL_S)  # each attack starts with team-b's requests all there
                encoded = json.dumps({"model": args.model, **body}).encode()
                before = rss_mb(process.pid)
                window = measure(url, args.model, process.pid, args.seconds, (path, encoded))
                report(name, window, quiet_p50, before)
            print(f"gateway RSS at the end {rss_mb(process.pid):.0f} MB (start {rss_start:.0f})")
        finally:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()


if __name__ == "__main__":
    main()
