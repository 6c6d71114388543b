"""The hostile benchmarks' shared runner: the starter's gateway, the victim's latency, the row.

One ``triton-gateway serve`` the starter's way (a sidecar on the CPU, tenants ``team-a`` and
``team-b`` with the limits ``triton-gateway init`` writes, kept by its embedded redis-server). Each
keyed attack gets a tenant of its own with ``team-b``'s limits (``team-b-1``, ``team-b-2``...),
so that every attack starts with a full request limit instead of a minute's wait.

``measure`` runs the victim (``team-a``'s 4-token chat, one at a time, at most two a second:
within its 120 requests a minute) beside an attack for a window, sampling the gateway's RSS;
``Row`` is one line of the closing table.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from deploy.sidecar.models import ensure_smollm2
from gateway.ops.starter import MODEL, write_starter
from gateway.tenancy.service import digest
from tests.support.gateway import serve_process, stop_process

VICTIM_INTERVAL_S = 0.5
"""The victim sends at most one request this often: team-a's 120 requests a minute."""
VICTIM = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}


def attacker_key(index: int) -> str:
    """The key of the ``index``-th attacker tenant (0: ``team-b``)."""
    return f"tgw-hostile-b{index}-0123456789abcdef0123456789abcdef"


def starter_config(folder: Path, attackers: int) -> tuple[dict[str, Any], str]:
    """``triton-gateway init``'s settings written into ``folder``, with ``team-b``'s key
    replaced and ``attackers - 1`` more tenants with ``team-b``'s limits; and team-a's key."""
    keys = write_starter(folder, ensure_smollm2())
    config = yaml.safe_load((folder / "gateway.yaml").read_text())
    tenancy = config["tenancy"]
    team_b = next(tenant for tenant in tenancy["tenants"] if tenant["name"] == "team-b")
    tenancy["keys"] = [key for key in tenancy["keys"] if key["tenant"] != "team-b"]
    for index in range(attackers):
        name = "team-b" if index == 0 else f"team-b-{index}"
        if index:
            tenancy["tenants"].append({**team_b, "name": name})
        tenancy["keys"].append({"tenant": name, "sha256": digest(attacker_key(index))})
    config["log_level"] = "ERROR"
    return config, keys.team_a


def rss_mb(pid: int) -> float:
    """Resident memory of one process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Window:
    """What one measuring window saw: the victim's latencies, the attacker's answers (status
    and seconds, in the order sent), the gateway's RSS."""

    victim: list[float] = field(default_factory=list)
    victim_failures: int = 0
    attacker: list[tuple[str, float]] = field(default_factory=list)
    rss_start_mb: float = 0.0
    rss_peak_mb: float = 0.0
    answers: str | None = None
    """The attacker's answers in words, where an attack counts them itself (no status each)."""
    refusal_s: float | None = None
    """How long a refusal took (median), where an attack times them itself."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, status: str, seconds: float) -> None:
        with self.lock:
            self.attacker.append((status, seconds))


Attack = Callable[[float, Window], None]
"""Runs until the monotonic deadline it is given, recording each answer in the window."""


def _victim(url: str, key: str, until: float, window: Window) -> None:
    body = VICTIM
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, timeout=120) as client:
        while time.monotonic() < until:
            started = time.perf_counter()
            answer = client.post("/v1/chat/completions", json=body, headers=headers)
            elapsed = time.perf_counter() - started
            if answer.status_code == 200:
                window.victim.append(elapsed)
            else:
                window.victim_failures += 1
            time.sleep(max(0.0, started + VICTIM_INTERVAL_S - time.perf_counter()))


def _sample(pid: int, window: Window, stop: threading.Event) -> None:
    while not stop.wait(0.1):
        window.rss_peak_mb = max(window.rss_peak_mb, rss_mb(pid))


def measure(
    url: str, key: str, pid: int, seconds: float, attacks: list[Attack] | None = None
) -> Window:
    """The victim for ``seconds``, beside ``attacks`` (each in a thread of its own, started
    first and given a second's lead so the victim meets the attack under way)."""
    window = Window(rss_start_mb=rss_mb(pid), rss_peak_mb=rss_mb(pid))
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(pid, window, stop), daemon=True)
    sampler.start()
    lead = 1.0 if attacks else 0.0
    until = time.monotonic() + lead + seconds
    threads = [threading.Thread(target=attack, args=(until, window)) for attack in attacks or []]
    for thread in threads:
        thread.start()
    time.sleep(lead)
    _victim(url, key, until, window)
    for thread in threads:
        thread.join()
    stop.set()
    sampler.join()
    return window


def post_attack(url: str, key: str, path: str, make_body: Callable[[], bytes]) -> Attack:
    """An attacker posting ``make_body()`` with ``key`` one request after another, as fast as
    they are answered."""

    def attack(until: float, window: Window) -> None:
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        with httpx.Client(base_url=url, timeout=300) as client:
            while time.monotonic() < until:
                body = make_body()
                started = time.perf_counter()
                try:
                    status = str(client.post(path, content=body, headers=headers).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                window.record(status, time.perf_counter() - started)

    return attack


@dataclass
class Row:
    """One attack's line of the table."""

    attack: str
    quiet_p50: float
    window: Window

    def cells(self) -> list[str]:
        window = self.window
        p50 = statistics.median(window.victim) if window.victim else float("nan")
        statuses = sorted({status for status, _ in window.attacker})
        counted = ", ".join(
            f"{s}: {sum(1 for got, _ in window.attacker if got == s)}" for s in statuses
        )
        first_429 = next((i + 1 for i, (s, _) in enumerate(window.attacker) if s == "429"), None)
        refused = [seconds for status, seconds in window.attacker if status != "200"]
        refusal = window.refusal_s
        if refusal is None and refused:
            refusal = statistics.median(refused)
        victim = f"{len(window.victim)}"
        if window.victim_failures:
            victim += f" ({window.victim_failures} failed)"
        return [
            self.attack,
            f"{self.quiet_p50 * 1000:.0f} ms",
            f"{p50 * 1000:.0f} ms",
            f"{p50 / self.quiet_p50:.2f}x",
            victim,
            window.answers if window.answers is not None else counted or "-",
            str(first_429) if first_429 else "-",
            f"{refusal * 1000:.0f} ms" if refusal is not None else "-",
            f"{window.rss_start_mb:.0f} → {window.rss_peak_mb:.0f} MB",
        ]


HEADER = [
    "attack",
    "victim p50 quiet",
    "under attack",
    "ratio",
    "victim answers",
    "attacker's answers",
    "first 429 at request",
    "time to the refusal (median)",
    "gateway RSS start → peak",
]


@dataclass(frozen=True)
class Starter:
    """The served starter: its URL, the gateway's pid, team-a's key."""

    url: str
    pid: int
    victim_key: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@contextlib.contextmanager
def starter(attackers: int) -> Iterator[Starter]:
    """``triton-gateway serve`` on the starter's settings with ``attackers`` attacker tenants."""
    with tempfile.TemporaryDirectory(prefix="hostile-") as folder:
        config, victim_key = starter_config(Path(folder), attackers)
        # Served from the starter's folder: its relative paths (deploy.yaml, the adapter) hold.
        url, process = serve_process(
            config,
            Path(folder),
            "hostile",
            timeout_s=600,
            env={"TOKENIZERS_PARALLELISM": "false"},
        )
        try:
            yield Starter(url, process.pid, victim_key)
        finally:
            stop_process(process)


def run_attacks(
    served: Starter, seconds: float, attacks: list[tuple[str, list[Attack]]]
) -> list[Row]:
    """The victim quiet (after a warm-up), then beside each attack in turn, then quiet again
    (the machine's other load moves the quiet figure): the table's rows."""
    url, key, pid = served.url, served.victim_key, served.pid
    measure(url, key, pid, 2.0)
    quiet = measure(url, key, pid, seconds)
    quiet_p50 = statistics.median(quiet.victim)
    rows = [Row("none (quiet)", quiet_p50, quiet)]
    for name, attackers in attacks:
        rows.append(Row(name, quiet_p50, measure(url, key, pid, seconds, attackers)))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    rows.append(Row("none (quiet, after)", quiet_p50, measure(url, key, pid, seconds)))
    return rows


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)
