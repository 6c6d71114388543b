"""Two gateway processes sharing one real Redis: limits hold across replicas, and survive faults.

The gateways are `triton-gateway serve` processes in front of the shared test sidecar.
Replica A fails closed while Redis is unreachable, replica B fails open.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.tenancy.service import digest, new_key
from tests.support.engine_probe import EngineProcess
from tests.support.gateway import serve_process
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow

RPM, TPM, BURST = 120, 3000, 0.05
KEYS = {name: new_key() for name in ("rpm", "tpm", "conc", "spare")}
ADMIN_KEY = new_key()
SCRAPER = {"Authorization": f"Bearer {ADMIN_KEY}"}
LEASE_TTL_S = 2.0
DURATION_S = 10.5
TOLERANCE = 2
"""Requests (of the request limit; of the token limit, their tokens) that the admitted total may
be off what the limits allow over the run: the last admission's timing either way."""


@dataclass
class Replica:
    url: str
    process: subprocess.Popen[bytes]

    def post(self, body: dict[str, Any], tenant: str, path: str = "/v1/chat/completions") -> Any:
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
        return httpx.post(f"{self.url}{path}", json=body, headers=headers, timeout=60)


def _config(sidecar: Sidecar, model_dir: Path, redis_url: str, on_failure: str) -> dict[str, Any]:
    tenants = [
        {"name": "rpm", "requests_per_minute": RPM, "burst": BURST},
        {"name": "tpm", "tokens_per_minute": TPM, "burst": BURST},
        {"name": "conc", "max_concurrency": 2},
        {"name": "spare"},
    ]
    return {
        "models": [
            {
                "name": "tiny",
                "triton_url": sidecar.grpc_url,
                # The BLS stops its generation when the gRPC call is cancelled, so the streams
                # of a killed replica do not keep the shared engine busy.
                "triton_model": "tiny_tensorrt_llm_bls",
                "tokenizer_dir": str(model_dir),
            }
        ],
        "limits": {"shutdown_grace_s": 2},
        "log_level": "WARNING",
        "tenancy": {
            "tenants": tenants,
            "keys": [{"tenant": name, "sha256": digest(key)} for name, key in KEYS.items()],
            "admin_key_sha256": digest(ADMIN_KEY),
            "store": {
                "kind": "redis",
                "url": redis_url,
                "on_failure": on_failure,
                "lease_ttl_s": LEASE_TTL_S,
                "refresh_s": 0.2,
                # A stopped Redis refuses at once: the timeout is only for a slow one, and a
                # busy 2-core machine has made a call take longer than 0.2 s (a 503 on the
                # fail-closed replica, one admitted past the limit on the fail-open one).
                "timeout_s": 2.0,
            },
        },
    }


def _start(config: dict[str, Any], workdir: Path, name: str) -> Replica:
    return Replica(*serve_process(config, workdir, name))


@pytest.fixture(scope="module")
def stack(
    sidecar: Sidecar, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RedisServer, Replica, Replica]]:
    redis = RedisServer().start()
    workdir = tmp_path_factory.mktemp("replicas")
    replicas = [
        _start(_config(sidecar, tiny_model_dir, redis.url, policy), workdir, name)
        for name, policy in (("a", "closed"), ("b", "open"))
    ]
    yield redis, replicas[0], replicas[1]
    for replica in replicas:
        if replica.process.poll() is None:
            replica.process.send_signal(signal.SIGTERM)
    for replica in replicas:
        try:
            replica.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            replica.process.kill()
    redis.stop()


@dataclass
class Tally:
    admitted: int = 0
    refused: int = 0
    tokens: int = 0
    errors: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _offer(replicas: list[Replica], tenant: str, per_second: float, tally: Tally) -> None:
    """Send ``per_second`` requests a second for DURATION_S, alternating replicas and streaming."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}

    def one(index: int) -> None:
        replica = replicas[index % 2]
        stream = index % 4 >= 2
        payload = {
            **body,
            "stream": stream,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        }
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
        with tally.lock:
            tally.times.append(time.monotonic())
        with (
            httpx.Client(timeout=60) as client,
            client.stream(
                "POST", f"{replica.url}/v1/chat/completions", json=payload, headers=headers
            ) as reply,
        ):
            text = reply.read().decode()
        with tally.lock:
            if reply.status_code == 429:
                tally.refused += 1
            elif reply.status_code == 200:
                tally.admitted += 1
                tally.tokens += _total_tokens(text, stream)
            else:
                tally.errors.append(f"{reply.status_code} {text[:200]}")

    threads = []
    started = time.monotonic()
    index = 0
    while time.monotonic() - started < DURATION_S:
        thread = threading.Thread(target=one, args=(index,))
        thread.start()
        threads.append(thread)
        index += 1
        time.sleep(max(0.0, started + index / per_second - time.monotonic()))
    for thread in threads:
        thread.join(timeout=60)


def _total_tokens(text: str, stream: bool) -> int:
    import json

    if not stream:
        return int(json.loads(text)["usage"]["total_tokens"])
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    return int(events[-1]["usage"]["total_tokens"])


def test_limits_hold_across_two_replicas_at_three_times_the_limit(
    stack: tuple[RedisServer, Replica, Replica], capsys: pytest.CaptureFixture[str]
) -> None:
    _, a, b = stack
    requests, tokens = Tally(), Tally()
    prompt = a.post({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                     "max_tokens": 20}, "spare").json()["usage"]["total_tokens"]  # fmt: skip
    offers = [
        threading.Thread(target=_offer, args=([a, b], "rpm", 3 * RPM / 60, requests)),
        threading.Thread(target=_offer, args=([a, b], "tpm", 3 * TPM / 60 / prompt, tokens)),
    ]
    for offer in offers:
        offer.start()
    for offer in offers:
        offer.join()
    span_r = requests.times[-1] - requests.times[0]
    span_t = tokens.times[-1] - tokens.times[0]
    allowed_requests = RPM * BURST + RPM / 60 * span_r
    allowed_tokens = TPM * BURST + TPM / 60 * span_t
    with capsys.disabled():
        print(
            f"\n  two replicas, {span_r:.1f} s at 3x the limit:"
            f"\n  requests: offered {requests.admitted + requests.refused}, admitted "
            f"{requests.admitted}, allowed {allowed_requests:.1f} "
            f"({requests.admitted / allowed_requests - 1:+.1%})"
            f"\n  tokens:   offered {(tokens.admitted + tokens.refused) * prompt}, admitted "
            f"{tokens.tokens} in {tokens.admitted} requests, allowed {allowed_tokens:.0f} "
            f"({tokens.tokens / allowed_tokens - 1:+.1%})"
        )
    assert requests.errors == tokens.errors == []
    assert requests.refused > requests.admitted and tokens.refused > tokens.admitted
    assert abs(requests.admitted - allowed_requests) <= TOLERANCE
    assert abs(tokens.tokens - allowed_tokens) <= TOLERANCE * prompt


def test_a_revoked_key_is_locked_out_on_both_replicas_within_a_few_polls(
    stack: tuple[RedisServer, Replica, Replica],
) -> None:
    _, a, b = stack
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(f"{a.url}/admin/keys", json={"tenant": "spare"}, headers=admin).json()
    headers = {"Authorization": f"Bearer {made['key']}"}
    deadline = time.monotonic() + 10
    while httpx.get(f"{b.url}/v1/models", headers=headers).status_code != 200:
        assert time.monotonic() < deadline, "replica b never saw the new key"
        time.sleep(0.05)
    revoked = time.monotonic()
    assert httpx.delete(f"{a.url}/admin/keys/{made['key_id']}", headers=admin).status_code == 204
    for replica in (a, b):
        while httpx.get(f"{replica.url}/v1/models", headers=headers).status_code != 401:
            assert time.monotonic() - revoked < 5.0, f"{replica.url} still accepts the key"
            time.sleep(0.02)


def test_redis_down_applies_each_replicas_policy_and_recovers(
    stack: tuple[RedisServer, Replica, Replica],
) -> None:
    redis, a, b = stack
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    redis.kill()
    try:
        closed, opened = a.post(body, "spare"), b.post(body, "spare")
        assert closed.status_code == 503
        assert closed.json()["error"]["code"] == "rate_limiter_unavailable"
        assert closed.headers["Retry-After"] == "1"
        assert opened.status_code == 200
    finally:
        redis.start()
    restarted = time.monotonic()
    while a.post(body, "spare").status_code != 200:
        assert time.monotonic() - restarted < 20, "replica a did not recover"
        time.sleep(0.1)
    assert b.post(body, "spare").status_code == 200
    for replica in (a, b):
        metrics = httpx.get(f"{replica.url}/metrics", headers=SCRAPER).text
        assert "gateway_limiter_unavailable_total" in metrics


def test_leases_of_a_killed_replica_expire(
    stack: tuple[RedisServer, Replica, Replica], sidecar: Sidecar
) -> None:
    _, a, b = stack
    long = {"model": "tiny", "prompt": "The cat", "max_tokens": 3000, "stream": True}
    headers = {"Authorization": f"Bearer {KEYS['conc']}"}
    clients = [httpx.Client(timeout=60) for _ in range(2)]
    streams = [
        client.stream("POST", f"{b.url}/v1/completions", json=long, headers=headers)
        for client in clients
    ]
    lines = []  # kept referenced: a dropped line iterator closes its connection
    for stream in streams:
        reply = stream.__enter__()
        assert reply.status_code == 200
        lines.append(reply.iter_lines())
        assert next(lines[-1]).startswith("data: {")
    in_flight = 'gateway_tenant_requests_in_flight{tenant="conc"} 2.0'
    assert in_flight in httpx.get(f"{b.url}/metrics", headers=SCRAPER).text
    os.kill(b.process.pid, signal.SIGKILL)
    b.process.wait(timeout=10)
    killed = time.monotonic()
    short = {"model": "tiny", "prompt": "The cat", "max_tokens": 2}
    assert a.post(short, "conc", "/v1/completions").status_code == 429  # b's leases still held
    while a.post(short, "conc", "/v1/completions").status_code != 200:
        assert time.monotonic() - killed < LEASE_TTL_S + 10, (
            "the dead replica's leases never expired"
        )
        time.sleep(0.1)
    for client in clients:
        client.close()
    engine = EngineProcess(sidecar, "tiny_tensorrt_llm")
    while asyncio.run(engine.busy_seconds(0.5)) > 0.1:
        assert time.monotonic() - killed < 20, "the killed replica's generations still run"
