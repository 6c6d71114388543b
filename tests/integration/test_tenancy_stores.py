"""One contract for both limit stores: in this process, and in a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from adapters.contract import SamplingParams
from gateway.core.plan import ChoiceSpec, Plan, Prompt
from gateway.errors import RateLimitError
from gateway.tenancy.config import StoreSettings, TenancySettings, TenantPolicy
from gateway.tenancy.quota import Limits, MemoryStore, QuotaStore, Rejected, StoreUnavailable
from gateway.tenancy.redis_store import RedisStore
from gateway.tenancy.service import Tenancy
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(params=["memory", "redis"])
async def store(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[QuotaStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    redis_store = RedisStore.connect(redis_server.url, prefix=f"test-{uuid.uuid4().hex[:8]}")
    yield redis_store
    await redis_store.close()


def limits(**policy: object) -> Limits:
    return Limits.of(TenantPolicy(name="t", **policy))  # type: ignore[arg-type]


def lease() -> str:
    return uuid.uuid4().hex


def plan_of(max_tokens: int) -> Plan:
    """A one-choice plan of a 10-token prompt and ``max_tokens``."""
    spec = ChoiceSpec(0, 0, Prompt("p", 10), SamplingParams(max_tokens=max_tokens))
    return Plan(model="m", choices=(spec,), stream=True, include_usage=False)


async def redis_tenancy(
    redis_server: RedisServer, policy: TenantPolicy, *, send_ahead: bool = True
) -> Tenancy:
    """A started ``Tenancy`` of ``policy`` alone, its limits in Redis under a fresh prefix."""
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    settings = StoreSettings(
        kind="redis", url=redis_server.url, prefix=prefix, send_ahead=send_ahead
    )
    tenancy = Tenancy(TenancySettings(tenants=(policy,), store=settings))
    await tenancy.start()
    return tenancy


async def test_a_burst_then_a_denial_that_says_when(store: QuotaStore) -> None:
    # One a second, three at once: the bounds below leave half a second for the four calls.
    three_at_once = limits(requests_per_minute=60, burst=0.05)
    remaining = []
    for _ in range(3):
        quota = await store.admit("a", three_at_once, 0, lease())
        assert quota.requests is not None
        remaining.append(round(quota.requests[1].remaining))
    assert remaining == [2, 1, 0]
    with pytest.raises(Rejected) as denied:
        await store.admit("a", three_at_once, 0, lease())
    assert denied.value.limit == "requests"
    assert 0.5 < denied.value.retry_after <= 1.0
    await asyncio.sleep(denied.value.retry_after + 0.01)
    await store.admit("a", three_at_once, 0, lease())


async def test_all_limits_or_none(store: QuotaStore) -> None:
    both = limits(requests_per_minute=60, tokens_per_minute=600, burst=0.5)  # 30 req, 300 tokens
    await store.admit("b", both, 250, lease())
    with pytest.raises(Rejected) as denied:
        await store.admit("b", both, 100, lease())
    assert denied.value.limit == "tokens"
    quota = await store.admit("b", both, 10, lease())
    assert quota.requests is not None and quota.tokens is not None
    assert round(quota.requests[1].remaining) == 28, "the denied request took no request"
    assert 39 <= quota.tokens[1].remaining <= 41


async def test_settling_gives_back_what_was_not_used(store: QuotaStore) -> None:
    tokens = limits(tokens_per_minute=600, burst=0.25)  # 150 tokens at once
    first = lease()
    await store.admit("c", tokens, 100, first)
    await store.settle("c", tokens, 80, first)  # used 20 of the 100
    quota = await store.admit("c", tokens, 100, lease())
    assert quota.tokens is not None
    assert 29 <= quota.tokens[1].remaining <= 31  # 150 - 20 - 100
    with pytest.raises(Rejected):
        await store.admit("c", tokens, 40, lease())


async def test_concurrency_leases(store: QuotaStore) -> None:
    two = limits(max_concurrency=2)
    held = [lease(), lease()]
    for name in held:
        await store.admit("d", two, 0, name)
    with pytest.raises(Rejected) as denied:
        await store.admit("d", two, 0, lease())
    assert denied.value.limit == "concurrency"
    await store.settle("d", two, 0, held[0])
    await store.admit("d", two, 0, lease())


async def test_daily_tokens(store: QuotaStore) -> None:
    daily = limits(tokens_per_minute=10_000, tokens_per_day=500)
    await store.admit("e", daily, 400, lease())
    with pytest.raises(Rejected) as denied:
        await store.admit("e", daily, 200, lease())
    assert denied.value.limit == "tokens_per_day"
    assert denied.value.retry_after > 1000  # a day's worth of refill for 100 tokens


async def test_tenants_never_share_a_budget(store: QuotaStore) -> None:
    one = limits(requests_per_minute=60, burst=1 / 60)
    await store.admit("f", one, 0, lease())
    with pytest.raises(Rejected):
        await store.admit("f", one, 0, lease())
    await store.admit("g", one, 0, lease())


async def test_leases_of_a_gateway_that_died_expire(redis_server: RedisServer) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    one = limits(max_concurrency=1)
    dead = RedisStore.connect(redis_server.url, prefix=prefix, lease_ttl_s=2.0)
    await dead.admit("h", one, 0, lease())
    await dead.close()  # stops renewing, as a killed gateway would
    alive = RedisStore.connect(redis_server.url, prefix=prefix, lease_ttl_s=2.0)
    with pytest.raises(Rejected):
        await alive.admit("h", one, 0, lease())
    await asyncio.sleep(2.1)
    await alive.admit("h", one, 0, lease())
    await alive.close()


async def test_a_held_lease_is_renewed_while_its_request_runs(redis_server: RedisServer) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    one = limits(max_concurrency=1)
    holder = RedisStore.connect(redis_server.url, prefix=prefix, lease_ttl_s=1.0)
    other = RedisStore.connect(redis_server.url, prefix=prefix, lease_ttl_s=1.0)
    await holder.admit("i", one, 0, lease())
    await asyncio.sleep(2.5)  # well past the ttl: only renewal keeps it
    with pytest.raises(Rejected):
        await other.admit("i", one, 0, lease())
    await holder.close()
    await other.close()


async def test_a_tenants_redis_keys_share_one_cluster_slot() -> None:
    store = RedisStore.connect("redis://127.0.0.1:1/0", prefix="tgw")
    assert all("{team-a}" in key for key in store.keys("team-a"))
    await store.close()


async def test_an_unreachable_redis_fails_fast() -> None:
    store = RedisStore.connect("redis://127.0.0.1:1/0", timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await store.admit("j", limits(requests_per_minute=1), 0, lease())
    assert time.monotonic() - started < 5.0
    await store.close()


async def test_connections_closed_by_a_redis_restart_are_not_an_outage() -> None:
    server = RedisServer().start()
    store = RedisStore.connect(server.url, timeout_s=0.5)
    try:
        # A connection the restart leaves dead, with commands that share it answered before.
        await store.admit("k", limits(max_concurrency=8), 0, lease())
        await asyncio.gather(*(store.link.call("PING") for _ in range(6)))
        server.kill()
        with pytest.raises(StoreUnavailable):
            await store.admit("k", limits(max_concurrency=8), 0, lease())
        server.start()
        await asyncio.gather(
            *(store.admit("k", limits(max_concurrency=8), 0, lease()) for _ in range(6))
        )
    finally:
        await store.close()
        server.stop()


async def test_an_admission_is_on_its_way_before_it_is_awaited(redis_server: RedisServer) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    store = RedisStore.connect(redis_server.url, prefix=prefix)
    two = limits(max_concurrency=2)
    try:
        await store.admit("m", two, 0, lease())  # the connection is open from here on
        first = lease()
        pending = store.admit("m", two, 0, first)
        # No await since: the loop has not run, so only a command written by ``admit`` itself
        # can have reached Redis. A blocking client watches it arrive.
        watcher = redis.Redis.from_url(redis_server.url)
        deadline = time.monotonic() + 10.0
        while not watcher.zscore(store.keys("m")[3], first) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert watcher.zscore(store.keys("m")[3], first) is not None
        watcher.close()
        quota = await pending
        assert quota.requests is None and quota.tokens is None
        with pytest.raises(Rejected):
            await store.admit("m", two, 0, lease())
    finally:
        await store.close()


async def test_an_admission_left_before_its_answer_still_settles(
    redis_server: RedisServer,
) -> None:
    """A request cancelled while its admission is on its way to Redis still learns that it
    holds a lease and gives it back, so the tenant's one request at a time is free again."""
    policy = TenantPolicy(name="solo", max_concurrency=1, tokens_per_minute=6000)
    tenancy = await redis_tenancy(redis_server, policy)
    plan = plan_of(20)
    try:
        left: dict[str, str] = {}
        admission = await tenancy.admission(policy, plan, left)
        waiting = asyncio.ensure_future(admission.admitted())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await admission.settle(3)
        assert left["x-ratelimit-limit-tokens"] == "6000", "it was admitted: its error says so"
        shown: dict[str, str] = {}
        again = await tenancy.admission(policy, plan, shown)
        await again.admitted()
        assert shown["x-ratelimit-limit-tokens"] == "6000"
        refused = await tenancy.admission(policy, plan, {})
        with pytest.raises(RateLimitError):
            await refused.admitted()
        await refused.settle(0)
        await again.settle(30)
    finally:
        await tenancy.close()


@pytest.mark.parametrize("send_ahead", [True, False])
async def test_an_admission_is_expected_only_once_an_answer_left_room(
    redis_server: RedisServer, send_ahead: bool
) -> None:
    """A tenant's first request waits for its answer; once an answer left it far from its
    limits the next is expected to be admitted, unless the store is told to wait always."""
    policy = TenantPolicy(name="roomy", tokens_per_minute=6000, burst=1.0)
    tenancy = await redis_tenancy(redis_server, policy, send_ahead=send_ahead)
    small, large = plan_of(20), plan_of(5000)
    try:
        first = await tenancy.admission(policy, small, {})
        assert not first.expected
        await first.admitted()
        second = await tenancy.admission(policy, small, {})
        assert second.expected is send_ahead
        # Past the headroom: waits for its answer (which admits it).
        third = await tenancy.admission(policy, large, {})
        assert not third.expected
        for admission in (second, third):
            await admission.admitted()
            await admission.settle(0)
        await first.settle(0)
    finally:
        await tenancy.close()


async def test_an_expected_admission_writes_its_command_once_the_request_is_on_its_way(
    redis_server: RedisServer,
) -> None:
    """An admission that waits for its answer writes its command at once, to be answered while
    the Triton request is built; one expected to admit writes it a turn of the event loop later,
    so the request, sent in the turn it was built in, goes first."""
    policy = TenantPolicy(name="ordered", tokens_per_minute=6000, burst=1.0)
    tenancy = await redis_tenancy(redis_server, policy)
    written: list[str] = []
    admit = tenancy.store.admit

    def recorded(tenant: str, *args: Any) -> Any:
        written.append(tenant)
        return admit(tenant, *args)

    tenancy.store.admit = recorded  # type: ignore[method-assign]
    try:
        first = await tenancy.admission(policy, plan_of(20), {})
        assert not first.expected
        assert written == ["ordered"]
        await first.admitted()
        second = await tenancy.admission(policy, plan_of(20), {})
        assert second.expected
        assert written == ["ordered"]
        await asyncio.sleep(0)
        assert written == ["ordered", "ordered"]
        await second.admitted()
        await second.settle(0)
        await first.settle(0)
    finally:
        await tenancy.close()


async def test_admissions_waiting_for_their_answers_count_against_the_room(
    redis_server: RedisServer,
) -> None:
    """A burst of one tenant's requests before Redis answers any of them: each is expected to
    be admitted only while the room the last answer showed holds it and those before it."""
    policy = TenantPolicy(name="bursty", tokens_per_minute=6000, burst=1.0)
    tenancy = await redis_tenancy(redis_server, policy)
    try:
        first = await tenancy.admission(policy, plan_of(20), {})
        await first.admitted()
        # 5,970 left; a quarter of 6,000 must stay: 4,470 for requests of 1,010 tokens each.
        burst = [await tenancy.admission(policy, plan_of(1000), {}) for _ in range(5)]
        assert [admission.expected for admission in burst] == [True] * 4 + [False]
        for admission in burst:
            with contextlib.suppress(RateLimitError):
                await admission.admitted()
            await admission.settle(0)
        await first.settle(0)
    finally:
        await tenancy.close()
