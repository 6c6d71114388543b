"""A pool of replicas over the scripted backend: choice, failover before the first token,
saturation, ejection, stalls, membership, probes and the per-replica metrics."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Sequence

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from adapters.contract import (
    BackendUnavailable,
    GenerationRequest,
    InferenceFailed,
    InvalidRequest,
    LoraAdapter,
    ModelTarget,
    SamplingParams,
    TokenChunk,
)
from adapters.scripted import ScriptedBackend
from gateway.errors import ServiceUnavailableError
from gateway.replicas import dispatch
from gateway.replicas.metrics import ReplicaMetrics
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.router import Router
from gateway.replicas.settings import RoutingSettings
from gateway.replicas.signals import EngineSignals
from gateway.replicas.sources import DnsName, ReplicaAddress
from gateway.replicas.watch import PoolWatch

TARGET = ModelTarget(url="unused", triton_model="m_ensemble", kind="ensemble")
CHUNKS = [TokenChunk("a", 1), TokenChunk("b", 1, final=True)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def request(ids: Sequence[int] = (), adapter: str | None = None) -> GenerationRequest:
    lora = LoraAdapter(adapter, task_id=hash(adapter)) if adapter else None
    return GenerationRequest(
        request_id="r", prompt="p", params=SamplingParams(max_tokens=2), stream=True,
        prompt_ids=tuple(ids), lora=lora,
    )  # fmt: skip


def pool_of(names: Sequence[str], clock: Clock | None = None, **routing: object) -> ReplicaPool:
    settings = RoutingSettings(**routing)  # type: ignore[arg-type]
    pool = ReplicaPool("m", TARGET, settings, retry_after_s=3, clock=clock or Clock())
    pool.update([ReplicaAddress(name, f"{name}:1", None) for name in names])
    for replica in pool.replicas.values():
        pool.probed(replica, True)
    return pool


async def drain(chunks: object) -> list[str]:
    return [chunk.text async for chunk in chunks]  # type: ignore[attr-defined]


class Observer:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def replica(self, name: str, address: str) -> None:
        self.events.append(("replica", name))

    def failover(self, name: str, error: BaseException) -> None:
        self.events.append(("failover", name))


async def test_a_replica_that_is_down_is_ejected_and_the_request_moves() -> None:
    pool = pool_of(["a", "b"], policy="round_robin")
    backend = ScriptedBackend(CHUNKS)
    backend.down.add("a:1")
    observer = Observer()
    assert await drain(dispatch.stream(pool, backend, request(), observer)) == ["a", "b"]
    assert backend.urls == ["a:1", "b:1"]
    assert observer.events == [("replica", "a"), ("failover", "a"), ("replica", "b")]
    a, b = pool.replicas["a"], pool.replicas["b"]
    assert (a.health.state, a.retries, a.health.ejections) == ("ejected", 1, {"unavailable": 1})
    assert (a.in_flight, b.in_flight, b.routed) == (0, 0, 1)
    # Ejected: the next requests go to b only.
    for _ in range(3):
        await drain(dispatch.stream(pool, backend, request()))
    assert backend.urls[2:] == ["b:1"] * 3


@pytest.mark.parametrize(
    ("error", "tries"),
    [
        (InferenceFailed("engine crashed"), 2),
        (InvalidRequest("bad top_k", param="top_k"), 1),
    ],
)
async def test_which_failures_before_the_first_token_are_retried(
    error: Exception, tries: int
) -> None:
    pool = pool_of(["a", "b"])
    backend = ScriptedBackend([error])
    with pytest.raises(type(error)):
        await drain(dispatch.stream(pool, backend, request()))
    assert len(backend.urls) == tries
    # A failure of the request is not the replica's: nobody is ejected.
    assert all(r.health.routable for r in pool.replicas.values())


async def test_a_request_is_retried_once_only() -> None:
    pool = pool_of(["a", "b", "c"], policy="round_robin")
    backend = ScriptedBackend(CHUNKS)
    # Round robin: a first, then the second of the others.
    backend.down.update({"a:1", "c:1"})
    with pytest.raises(BackendUnavailable):
        await drain(dispatch.stream(pool, backend, request()))
    assert backend.urls == ["a:1", "c:1"]


async def test_a_failure_after_the_first_token_is_not_retried() -> None:
    pool = pool_of(["a", "b"], policy="round_robin")
    backend = ScriptedBackend([TokenChunk("a", 1), BackendUnavailable("socket closed")])
    seen: list[str] = []
    with pytest.raises(BackendUnavailable):
        async for chunk in dispatch.stream(pool, backend, request()):
            seen.append(chunk.text)
    assert (seen, backend.urls) == (["a"], ["a:1"])
    assert pool.replicas["a"].health.state == "ejected"
    assert pool.replicas["a"].in_flight == 0


async def test_one_replica_gets_no_retry() -> None:
    pool = pool_of(["a"])
    backend = ScriptedBackend(CHUNKS)
    backend.down.add("a:1")
    with pytest.raises(BackendUnavailable, match="failed to connect"):
        await drain(dispatch.stream(pool, backend, request()))
    with pytest.raises(BackendUnavailable, match="no replica of m is available"):
        await drain(dispatch.stream(pool, backend, request()))


async def test_every_replica_saturated_is_a_503_with_retry_after() -> None:
    pool = pool_of(["a", "b"], max_in_flight=1)
    backend = ScriptedBackend(CHUNKS)
    backend.hung.update({"a:1", "b:1"})
    held = [asyncio.create_task(drain(dispatch.stream(pool, backend, request()))) for _ in "ab"]
    await asyncio.sleep(0.01)
    assert [r.in_flight for r in pool.replicas.values()] == [1, 1]
    with pytest.raises(ServiceUnavailableError) as refused:
        await drain(dispatch.stream(pool, backend, request()))
    assert (refused.value.code, refused.value.headers) == ("overloaded", {"Retry-After": "3"})
    assert pool.overloaded == 1
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    assert [r.in_flight for r in pool.replicas.values()] == [0, 0]


def test_a_pools_slots_stop_at_a_replica_whose_engine_reports_its_queue_full() -> None:
    clock = Clock()
    pool = pool_of(["a", "b", "c"], clock, max_in_flight=4, max_waiting=8)
    a, b, c = pool.replicas.values()
    assert pool.slots() == 12
    a.in_flight, a.signals, a.signals_at = 3, EngineSignals(waiting=8), clock.now
    b.signals, b.signals_at = EngineSignals(waiting=7), clock.now
    assert pool.slots() == 3 + 4 + 4  # a takes no more than it holds
    pool.failed(c, "unavailable")
    assert pool.slots() == 3 + 4
    clock.now += 100.0  # a's figures are stale: it counts whole again
    assert pool.slots() == 4 + 4
    pool.failed(a, "unavailable")
    pool.failed(b, "unavailable")
    assert pool.slots() == 4  # none routable: one replica's, for the pick to say so


async def test_a_stalled_replica_is_ejected_and_its_waiting_requests_move() -> None:
    clock = Clock()
    pool = pool_of(["a", "b"], clock, policy="round_robin", stall_s=5.0)
    backend = ScriptedBackend(CHUNKS)
    backend.hung.add("a:1")
    task = asyncio.create_task(drain(dispatch.stream(pool, backend, request())))
    await asyncio.sleep(0.01)
    pool.check_stalls()
    assert pool.replicas["a"].health.routable
    clock.now += 5.0
    pool.check_stalls()
    assert await asyncio.wait_for(task, 1) == ["a", "b"]
    assert backend.urls == ["a:1", "b:1"]
    assert pool.replicas["a"].health.ejections == {"stalled": 1}
    assert pool.replicas["a"].in_flight == 0


async def test_prefix_and_adapter_affinity_in_a_pool() -> None:
    pool = pool_of(["a", "b", "c"], prefix_block_tokens=4)
    backend = ScriptedBackend(CHUNKS)
    groups = {g: [g * 100 + i for i in range(12)] for g in range(3)}
    for round_ in range(4):
        for prefix in groups.values():
            await drain(dispatch.stream(pool, backend, request([*prefix, round_])))
    by_group = [backend.urls[g::3] for g in range(3)]
    assert [len(set(urls)) for urls in by_group] == [1, 1, 1]
    assert len({urls[0] for urls in by_group}) == 3
    hits = sum(r.prefix_hits for r in pool.replicas.values())
    assert hits == 9
    backend.urls.clear()
    for _ in range(3):
        for name in ("x", "y", "z"):
            await drain(dispatch.stream(pool, backend, request(adapter=name)))
    by_adapter = [backend.urls[i::3] for i in range(3)]
    assert [len(set(urls)) for urls in by_adapter] == [1, 1, 1]
    assert sum(r.adapter_hits for r in pool.replicas.values()) == 6


@pytest.mark.parametrize(
    ("slack", "expected"),
    [
        # One prefix: all would go to a; the bound keeps a within ceil(1.5 x 12 / 2) = 9...
        (0, {"a:1": 9, "b:1": 3}),
        # ...or within the slack of b's load.
        (4, {"a:1": 9, "b:1": 3}),
        (8, {"a:1": 10, "b:1": 2}),
        (20, {"a:1": 12}),
    ],
)
async def test_affinity_gives_way_to_bounded_load(slack: int, expected: dict[str, int]) -> None:
    pool = pool_of(["a", "b"], prefix_block_tokens=4, load_slack=slack)
    backend = ScriptedBackend(CHUNKS)
    backend.hung.update({"a:1", "b:1"})
    ids = list(range(16))
    tasks = []
    for _ in range(12):
        tasks.append(asyncio.create_task(drain(dispatch.stream(pool, backend, request(ids)))))
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    assert Counter(backend.urls) == expected
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_membership_changes_keep_replicas_and_forget_the_removed() -> None:
    pool = pool_of(["a", "b"])
    a = pool.replicas["a"]
    pool.prefixes.record([1, 2], "b")
    added, removed = pool.update([ReplicaAddress("a", "a:1"), ReplicaAddress("c", "c:1")])
    assert (added, removed) == (["c"], ["b"])
    assert pool.replicas["a"] is a and a.health.routable
    assert pool.replicas["c"].health.state == "pending"
    assert pool.prefixes.matches([1, 2]) == {}


async def test_the_watch_probes_and_scrapes_and_follows_dns() -> None:
    addresses = {"10.0.0.1", "10.0.0.2"}

    async def resolver(host: str, port: int) -> list[str]:
        assert (host, port) == ("triton", 8001)
        return sorted(addresses)

    metrics = (
        'nv_trt_llm_request_metrics{model="m_tensorrt_llm",request_type="waiting"} 4\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",'
        'model="m_tensorrt_llm"} 32\n'
    )

    def answer(http_request: httpx.Request) -> httpx.Response:
        if http_request.url.host == "10.0.0.2":
            return httpx.Response(503)
        return httpx.Response(200, text=metrics)

    target = ModelTarget("unused", "m_ensemble", "ensemble", engine_model="m_tensorrt_llm")
    pool = ReplicaPool("m", target, RoutingSettings(), clock=Clock())
    backend = ScriptedBackend(CHUNKS)
    backend.down.add("10.0.0.2:8001")
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        watch = PoolWatch(pool, DnsName("triton", 8001, 8002), backend, http, resolver)
        await watch.resolve()
        await watch.scrape()
        states = {name: r.health.state for name, r in pool.replicas.items()}
        assert states == {"10.0.0.1:8001": "up", "10.0.0.2:8001": "pending"}
        first = pool.replicas["10.0.0.1:8001"]
        assert first.signals is not None and first.signals.waiting == 4
        assert pool.block_tokens == 32
        addresses.discard("10.0.0.1")
        addresses.add("10.0.0.3")
        await watch.resolve()
        assert sorted(pool.replicas) == ["10.0.0.2:8001", "10.0.0.3:8001"]
        assert pool.ready()


async def test_a_router_runs_its_watches_until_closed() -> None:
    class Model:
        name = "m"
        target = TARGET
        replicas = (ReplicaAddress("a", "a:1"), ReplicaAddress("b", "b:1"))
        routing = RoutingSettings(probe_interval_s=0.01)

    router = Router([Model()])
    pool = router.pool("m")
    assert pool is not None and router.pool("other") is None
    backend = ScriptedBackend(CHUNKS)
    assert router.preparer("other", backend, TARGET) is None
    prepare = router.preparer("m", backend, TARGET)
    assert prepare is not None
    backend.down.add("b:1")
    async with httpx.AsyncClient() as http:
        router.start(backend, http)
        await asyncio.sleep(0.05)
        assert {n: r.health.state for n, r in pool.replicas.items()} == {
            "a": "up",
            "b": "pending",
        }
        await router.close()
    assert await drain((await prepare(request())).stream()) == ["a", "b"]


async def test_replica_metrics() -> None:
    pool = pool_of(["a", "b"], policy="round_robin")
    backend = ScriptedBackend(CHUNKS)
    backend.down.add("a:1")
    await drain(dispatch.stream(pool, backend, request()))
    registry = CollectorRegistry()
    registry.register(ReplicaMetrics(lambda: [pool], lambda: backend))
    text = generate_latest(registry).decode()
    for line in (
        'gateway_replica_requests_total{model="m",replica="a"} 1.0',
        'gateway_replica_requests_total{model="m",replica="b"} 1.0',
        'gateway_replica_retries_total{model="m",replica="a"} 1.0',
        'gateway_replica_ejections_total{model="m",reason="unavailable",replica="a"} 1.0',
        'gateway_replica_up{model="m",replica="a"} 0.0',
        'gateway_replica_up{model="m",replica="b"} 1.0',
        'gateway_replica_in_flight{model="m",replica="b"} 0.0',
        'gateway_model_overloaded_total{model="m"} 0.0',
    ):
        assert line in text


def test_each_replica_is_reached_at_its_own_addresses() -> None:
    first = dataclasses.replace(TARGET, url="a:1", http_url="http://a:2")
    pool = ReplicaPool("m", first, RoutingSettings(), clock=Clock())
    pool.update(
        [ReplicaAddress("a", "a:1", None, "http://a:2"), ReplicaAddress("b", "b:1", None, None)]
    )
    targets = {name: replica.target for name, replica in pool.replicas.items()}
    assert (targets["a"].url, targets["a"].http_url) == ("a:1", "http://a:2")
    # A replica without an HTTP address never inherits another's: it is reached over gRPC.
    assert (targets["b"].url, targets["b"].http_url) == ("b:1", None)


async def test_the_watch_tells_the_pool_listeners_when_capacity_may_have_grown() -> None:
    """A replica coming up, and every scrape (an engine's waiting queue may have drained below
    ``max_waiting``), wake what waits for the pool's slots; a probe that changes nothing does
    not."""
    metrics = 'nv_trt_llm_request_metrics{model="m_tensorrt_llm",request_type="waiting"} 0\n'
    target = ModelTarget("unused", "m_ensemble", "ensemble", engine_model="m_tensorrt_llm")
    pool = ReplicaPool("m", target, RoutingSettings(max_in_flight=1, max_waiting=1), clock=Clock())
    woken: list[str] = []

    async def resolve_nothing(host: str, port: int) -> list[str]:
        raise AssertionError("a fixed list of replicas is never resolved")

    pool.on_capacity(lambda: woken.append("grown"))
    backend = ScriptedBackend(CHUNKS)
    source = (ReplicaAddress("a", "a:1", "http://a/metrics"),)
    transport = httpx.MockTransport(lambda _: httpx.Response(200, text=metrics))
    async with httpx.AsyncClient(transport=transport) as http:
        watch = PoolWatch(pool, source, backend, http, resolve_nothing)
        await watch.probe()
        assert woken == ["grown"]
        await watch.probe()
        assert woken == ["grown"]
        await watch.scrape()
        assert woken == ["grown", "grown"]
