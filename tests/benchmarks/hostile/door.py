"""Hostile clients with no key at the front door: a victim tenant's latency and the gateway's RSS.

    python -m tests.benchmarks.hostile.door [--phase-s 15] [--connections 4000] [--addresses 4]

Starts ``triton-gateway serve`` the starter's way (a sidecar on the CPU, tenants with keys, limits
in memory, one process) on the tiny model, and measures tenant ``team-a``'s 4-token chat,
one request at a time over a kept-alive connection from 127.0.0.1: quiet, then while

(a) a client sends a 256 MiB request head, again each time the gateway closes on it, and
(b) a slowloris holds ``--connections`` connections from ``--addresses`` other loopback
    addresses (127.0.0.2 and up), each sending half a request head and a header line every
    ``--trickle-s``, and opening a new one whenever the gateway closes one.

The attackers run in processes of their own. Printed per phase: the victim's p50 and p90 and its
answers, the gateway's RSS and open files (largest sampled) and CPU, and what the attackers were
answered.
Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from deploy.sidecar.models import ensure_tiny_model
from gateway.tenancy.service import digest, new_key
from tests.benchmarks.hostile.runner import rss_mb
from tests.support.gateway import serve_process, stop_process

GIANT_BYTES = 256 * 1024 * 1024
CHUNK = b"a" * (1024 * 1024)
MAX_ATTEMPTS = 100_000
"""Bound on the giant-head client's tries in one phase."""


@dataclass
class Phase:
    """What one phase measured."""

    name: str
    seconds: float
    latencies: list[float] = field(default_factory=list)
    answers: Counter[str] = field(default_factory=Counter)
    rss_mib: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    attack: dict[str, Any] = field(default_factory=dict)
    cpu_share: float = 0.0
    """The gateway process's CPU time over the phase's wall time (1.0: one core)."""

    def lines(self, quiet_p50: float | None) -> list[str]:
        p50 = statistics.median(self.latencies) if self.latencies else float("nan")
        p90 = statistics.quantiles(self.latencies, n=10)[-1] if len(self.latencies) > 9 else p50
        ratio = f" ({p50 / quiet_p50:.2f}x quiet)" if quiet_p50 else ""
        out = [
            f"{self.name}:",
            f"  victim: p50 {p50 * 1000:.0f} ms{ratio}, p90 {p90 * 1000:.0f} ms, "
            f"slowest {max(self.latencies, default=0) * 1000:.0f} ms; "
            f"{len(self.latencies) / self.seconds:.1f} answers/s; answers {dict(self.answers)}",
            f"  gateway: RSS {min(self.rss_mib):.0f} to {max(self.rss_mib):.0f} MiB, "
            f"open files up to {max(self.fds)}, CPU {self.cpu_share * 100:.0f}% of a core",
        ]
        if self.attack:
            out.append(f"  attacker: {self.attack}")
        return out


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sample(pid: int, phase: Phase, stop: threading.Event) -> None:
    started, cpu = time.monotonic(), _cpu_s(pid)
    while not stop.wait(0.25):
        phase.rss_mib.append(rss_mb(pid))
        phase.fds.append(len(list(Path(f"/proc/{pid}/fd").iterdir())))
    phase.cpu_share = (_cpu_s(pid) - cpu) / (time.monotonic() - started)


def _victim(url: str, key: str, phase: Phase, seconds: float) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 4,
    }
    headers = {"Authorization": f"Bearer {key}"}
    until = time.monotonic() + seconds
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        while time.monotonic() < until:
            started = time.perf_counter()
            try:
                status = str(client.post("/v1/chat/completions", json=body).status_code)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            phase.answers[status] += 1
            if status == "200":
                phase.latencies.append(time.perf_counter() - started)


def _status(sock: socket.socket) -> str:
    try:
        line = sock.recv(4096).split(b"\r\n", 1)[0]
    except OSError as exc:
        return type(exc).__name__
    return line.split(b" ")[1].decode() if line.startswith(b"HTTP/") else "closed"


def giant_head(port: int, seconds: float, results: Connection) -> None:
    """(a): a 256 MiB head, sent again each time the gateway closes on it."""
    until = time.monotonic() + seconds
    answers: Counter[str] = Counter()
    taken: list[int] = []
    answered_s: list[float] = []
    for _ in range(MAX_ATTEMPTS):
        if time.monotonic() >= until:
            break
        sent = 0
        started = time.monotonic()
        with socket.create_connection(
            ("127.0.0.1", port), timeout=seconds, source_address=("127.0.0.2", 0)
        ) as sock:
            try:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: door\r\nX-Big: ")
                while sent < GIANT_BYTES and time.monotonic() < until:
                    sock.sendall(CHUNK)
                    sent += len(CHUNK)
            except OSError:
                pass
            answers[_status(sock)] += 1
        taken.append(sent)
        answered_s.append(time.monotonic() - started)
    results.send(
        {
            "heads": sum(answers.values()),
            "answers": dict(answers),
            "MiB sent per head (median)": round(statistics.median(taken) / 2**20, 1),
            "seconds to the answer (median)": round(statistics.median(answered_s), 3),
        }
    )


async def _loris(
    port: int,
    source: str,
    until: float,
    trickle_s: float,
    tally: Counter[str],
    answered_s: list[float],
) -> None:
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(source, 0)
            )
        except OSError as exc:
            tally[f"connect {type(exc).__name__}"] += 1
            await asyncio.sleep(trickle_s)
            continue
        tally["opened"] += 1
        opened = time.monotonic()
        answer: bytes | None = None
        try:
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: door\r\n")
            while time.monotonic() < until:
                try:
                    answer = await asyncio.wait_for(reader.read(4096), trickle_s)
                    break
                except TimeoutError:
                    writer.write(b"X-Slow: 1\r\n")
        except OSError:
            answer = b""
        finally:
            writer.close()
        if answer is not None:
            status = answer.split(b" ")[1].decode() if answer.startswith(b"HTTP/") else "closed"
            tally[f"answered {status}"] += 1
            answered_s.append(time.monotonic() - opened)
            # A moment before the next: a flood of new connections is another attack.
            await asyncio.sleep(0.5)


def slowloris(
    port: int,
    seconds: float,
    connections: int,
    addresses: int,
    trickle_s: float,
    results: Connection,
) -> None:
    """(b): half-open connections held open as long as the gateway lets them."""
    tally: Counter[str] = Counter()
    answered_s: list[float] = []
    until = time.monotonic() + seconds

    async def attack() -> None:
        sources = [f"127.0.0.{2 + i % addresses}" for i in range(connections)]
        await asyncio.gather(
            *(_loris(port, s, until, trickle_s, tally, answered_s) for s in sources)
        )

    asyncio.run(attack())
    outcome: dict[str, Any] = dict(tally)
    if answered_s:
        outcome["seconds to the answer (median)"] = round(statistics.median(answered_s), 3)
    results.send(outcome)


def _run_phase(
    name: str,
    url: str,
    key: str,
    pid: int,
    seconds: float,
    attacker: Any = None,
    args: tuple[Any, ...] = (),
) -> Phase:
    phase = Phase(name, seconds)
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(pid, phase, stop), daemon=True)
    sampler.start()
    process = None
    if attacker is not None:
        receiving, sending = multiprocessing.get_context("spawn").Pipe(duplex=False)
        process = multiprocessing.get_context("spawn").Process(
            target=attacker, args=(*args, sending)
        )
        process.start()
        time.sleep(2.0)  # the attack under way before the victim is measured
    _victim(url, key, phase, seconds)
    if process is not None:
        if receiving.poll(seconds + 30):
            phase.attack = receiving.recv()
        process.join(30)
        if process.is_alive():
            process.kill()
    stop.set()
    sampler.join()
    return phase


def _check_alive(process: subprocess.Popen[bytes], workdir: Path) -> None:
    """The gateway measured is the one started here: one that could not bind its port (taken
    by another process between its choice and the bind) has exited, and its port answers for
    someone else."""
    if process.poll() is not None:
        log = (workdir / "door.log").read_text()
        raise RuntimeError(f"the gateway exited ({process.returncode}):\n{log[-2000:]}")


def _config(key: str) -> dict[str, Any]:
    engine = {"kind": "torch", "model_dir": str(ensure_tiny_model()), "max_batch_size": 16}
    team_a = {
        "name": "team-a",
        "models": ["tiny"],
        "requests_per_minute": 100_000,
        "tokens_per_minute": 10_000_000,
        "max_concurrency": 4,
        "max_tokens": 256,
    }
    return {
        "sidecars": {"inline": {"models": [{"name": "tiny", "engine": engine}]}},
        "tenancy": {
            "tenants": [team_a],
            "keys": [{"tenant": "team-a", "sha256": digest(key)}],
            "store": {"kind": "memory"},
        },
        "log_level": "WARNING",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--phase-s", type=float, default=15.0)
    parser.add_argument("--connections", type=int, default=4000)
    parser.add_argument("--addresses", type=int, default=4)
    parser.add_argument("--trickle-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    key = new_key()
    workdir = Path(tempfile.mkdtemp(prefix="door-"))
    url, process = serve_process(_config(key), workdir, "door", timeout_s=180)
    port = int(url.rsplit(":", 1)[1])
    try:
        _check_alive(process, workdir)
        _run_phase("warm-up", url, key, process.pid, 3.0)
        phases = [_run_phase("quiet", url, key, process.pid, args.phase_s)]
        phases.append(
            _run_phase(
                "(a) giant head",
                url,
                key,
                process.pid,
                args.phase_s,
                giant_head,
                (port, args.phase_s + 2.0),
            )
        )
        phases.append(
            _run_phase(
                f"(b) slowloris, {args.connections} connections from {args.addresses} addresses",
                url,
                key,
                process.pid,
                args.phase_s,
                slowloris,
                (port, args.phase_s + 2.0, args.connections, args.addresses, args.trickle_s),
            )
        )
        _check_alive(process, workdir)
    finally:
        stop_process(process)
    quiet = statistics.median(phases[0].latencies) if phases[0].latencies else None
    for phase in phases:
        print("\n".join(phase.lines(None if phase is phases[0] else quiet)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
