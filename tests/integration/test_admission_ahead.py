"""With limits in Redis, a request of a tenant far from its limits goes to Triton while Redis
answers its admission; should the answer refuse after all, the request is stopped at the engine
and the client gets the 429 alone. A request whose admission may refuse waits for the answer."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgspec
import pytest
import redis

from adapters.contract import SamplingParams
from deploy.sidecar.supervisor import Sidecar
from gateway.core.plan import ChoiceSpec, Plan, Prompt
from gateway.tenancy import KeyEntry, StoreSettings, TenancySettings, TenantPolicy
from gateway.tenancy.service import Tenancy, digest, new_key
from tests.support.engine_probe import EngineProcess
from tests.support.gateway import ENGINE_MODEL, ENSEMBLE_MODEL, LiveGateway, sidecar_settings
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow
PREFIX = "ahead"
ENTRIES = (ENSEMBLE_MODEL, ENGINE_MODEL)
"""The ensemble (stopped by its stop request and drained) and the engine itself (its call
closed)."""
TENANTS = {
    policy.name: policy
    for policy in (
        TenantPolicy(name="wide", tokens_per_minute=6000, burst=1.0),
        TenantPolicy(name="bounded", tokens_per_minute=6000, burst=1.0, max_concurrency=8),
        *(TenantPolicy(name=f"drained-{m}", tokens_per_minute=6000, burst=1.0) for m in ENTRIES),
    )
}
KEYS = {name: new_key() for name in TENANTS}
PAUSE_S = 1.5
"""How long Redis answers nobody (``CLIENT PAUSE``) while a request is on its way."""
LONG = {"prompt": "Once upon a time", "max_tokens": 3000, "min_tokens": 3000, "temperature": 0,
        "stream": True}  # fmt: skip
"""A generation that keeps the engine busy for longer than the pause on a fast host too (about
3.5 s on the 2-core machine)."""


@dataclass
class Answer:
    status: int
    started: float
    """When the request was sent (monotonic)."""
    first_body: float | None
    """When the first bytes of the answer's body arrived."""
    body: str
    ended: float
    """When the answer's last bytes arrived."""


@pytest.fixture(scope="module")
def gateway(
    sidecar: Sidecar, tiny_model_dir: Path, redis_server: RedisServer
) -> Iterator[LiveGateway]:
    tenancy = TenancySettings(
        tenants=tuple(TENANTS.values()),
        keys=tuple(KeyEntry(tenant=name, sha256=digest(key)) for name, key in KEYS.items()),
        # Redis answers within its timeout however long the pause.
        store=StoreSettings(kind="redis", url=redis_server.url, prefix=PREFIX, timeout_s=10.0),
    )
    settings = msgspec.structs.replace(sidecar_settings(sidecar, tiny_model_dir), tenancy=tenancy)
    live = LiveGateway(settings).start()
    yield live
    live.stop()


def _send(url: str, tenant: str, body: dict[str, object]) -> Answer:
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    started = time.monotonic()
    first: float | None = None
    parts = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers,
                      timeout=60) as response:  # fmt: skip
        for part in response.iter_text():
            if first is None:
                first = time.monotonic()
            parts.append(part)
    return Answer(response.status_code, started, first, "".join(parts), time.monotonic())


def _warm(gateway: LiveGateway, tenant: str) -> None:
    """One small request, so the gateway knows what the tenant's limits left."""
    body = {"model": ENSEMBLE_MODEL, "prompt": "hi", "max_tokens": 1}
    assert _send(gateway.url, tenant, body).status == 200


@contextlib.contextmanager
def _redis_paused(server: RedisServer) -> Iterator[float]:
    """Redis answers no client for ``PAUSE_S`` from a moment after the time yielded (taken
    before the pause is asked for, so however late this thread runs, the pause lasts at least
    until ``PAUSE_S`` after it)."""
    client = redis.Redis.from_url(server.url)
    try:
        asked = time.monotonic()
        client.client_pause(int(PAUSE_S * 1000))
        yield asked
    finally:
        client.close()


def _during_pause(
    gateway: LiveGateway,
    sidecar: Sidecar,
    server: RedisServer,
    tenant: str,
    model: str = ENSEMBLE_MODEL,
) -> tuple[float, Answer]:
    """Send ``LONG`` to ``model`` while Redis is paused: the engine's CPU seconds while the
    admission could not be answered (up to half the pause, so a loaded machine's late thread
    still reads within it), and the answer."""
    engine = EngineProcess(sidecar, "tiny_tensorrt_llm")
    with ThreadPoolExecutor(1) as pool, _redis_paused(server) as paused:
        before = engine.cpu_seconds()
        body = {**LONG, "model": model}
        future: Future[Answer] = pool.submit(_send, gateway.url, tenant, body)
        time.sleep(max(0.0, paused + PAUSE_S * 0.5 - time.monotonic()))
        busy = engine.cpu_seconds() - before
        answer = future.result(timeout=120)
    assert answer.ended > paused + PAUSE_S - 0.05, "answered while Redis was paused"
    return busy, answer


def test_a_tenant_far_from_its_limits_is_generating_while_redis_answers(
    gateway: LiveGateway, sidecar: Sidecar, redis_server: RedisServer
) -> None:
    _warm(gateway, "wide")
    busy, answer = _during_pause(gateway, sidecar, redis_server, "wide")
    assert busy > 0.1, f"the engine was idle while the admission was answered ({busy:.2f} s)"
    assert answer.status == 200 and answer.body.rstrip().endswith("data: [DONE]")
    assert answer.first_body is not None
    assert answer.first_body - answer.started > PAUSE_S * 0.5, "passed on before it was admitted"


def test_a_tenant_whose_admission_may_refuse_waits_for_the_answer(
    gateway: LiveGateway, sidecar: Sidecar, redis_server: RedisServer
) -> None:
    """A concurrency limit is not in the answers, so its tenant's requests are never sent
    ahead."""
    _warm(gateway, "bounded")
    busy, answer = _during_pause(gateway, sidecar, redis_server, "bounded")
    assert busy < 0.05, f"the engine ran before the admission was answered ({busy:.2f} s)"
    assert answer.status == 200 and answer.body.rstrip().endswith("data: [DONE]")


async def _take_nearly_all(redis_server: RedisServer, policy: TenantPolicy) -> None:
    """Another gateway reserves most of the tenant's tokens (and keeps them)."""
    store = StoreSettings(kind="redis", url=redis_server.url, prefix=PREFIX)
    other = Tenancy(TenancySettings(tenants=(policy,), store=store))
    await other.start()
    try:
        # About 50 tokens left, refilled at 100 a second: the ~3,005 of ``LONG`` are refused
        # for half a minute.
        spec = ChoiceSpec(0, 0, Prompt("p", 1), SamplingParams(max_tokens=5950))
        plan = Plan(model=ENSEMBLE_MODEL, choices=(spec,), stream=False, include_usage=False)
        await other.admit(policy, plan)
    finally:
        await other.close()


@pytest.mark.parametrize("model", ENTRIES)
def test_a_refusal_after_the_request_went_ahead_stops_it_at_the_engine(
    gateway: LiveGateway, sidecar: Sidecar, redis_server: RedisServer, model: str
) -> None:
    """The gateway's last answer left the tenant far from its limit; another gateway took
    nearly all of it since. The request went to the engine; the refusal stops it there, and
    the client sees the 429 and nothing else."""
    tenant = f"drained-{model}"
    _warm(gateway, tenant)
    asyncio.run(_take_nearly_all(redis_server, TENANTS[tenant]))
    engine = EngineProcess(sidecar, "tiny_tensorrt_llm")
    busy, answer = _during_pause(gateway, sidecar, redis_server, tenant, model)
    assert busy > 0.1, f"the request did not go ahead of its admission ({busy:.2f} s)"
    assert answer.status == 429
    error = msgspec.json.decode(answer.body)["error"]
    assert error["code"] == "rate_limit_exceeded" and "tokens per minute" in error["message"]
    time.sleep(0.3)
    after = asyncio.run(engine.busy_seconds(1.0))
    assert after < 0.15, f"the engine kept generating after the refusal ({after:.2f} CPU s)"
