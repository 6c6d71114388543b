"""The I/O at the edges of a pool: readiness probes, metrics scrapes and DNS resolution, each on
its own cadence, feeding the pool's state."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import httpx

from adapters.contract import Backend
from gateway.replicas.pool import Replica, ReplicaPool
from gateway.replicas.signals import parse_signals
from gateway.replicas.sources import DnsName, ReplicaSource, Resolver

logger = logging.getLogger(__name__)


class PoolWatch:
    """Keeps one pool's membership, health and load signals current."""

    def __init__(
        self,
        pool: ReplicaPool,
        source: ReplicaSource,
        backend: Backend,
        http: httpx.AsyncClient,
        resolver: Resolver,
    ) -> None:
        self.pool = pool
        self.source = source
        self._backend = backend
        self._http = http
        self._resolver = resolver
        self._resolve_failed = False
        if not isinstance(source, DnsName):
            pool.update(source)

    def loops(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        """The coroutines to run for as long as the pool serves, each repeating one step."""
        settings = self.pool.settings
        loops = [
            self._every(settings.probe_interval_s, self.probe),
            self._every(settings.scrape_interval_s, self.scrape),
        ]
        if isinstance(self.source, DnsName):
            loops.insert(0, self._every(settings.resolve_interval_s, self.resolve))
        return loops

    def _every(
        self, interval_s: float, step: Callable[[], Awaitable[None]]
    ) -> Callable[[], Coroutine[Any, Any, None]]:
        async def repeat() -> None:
            while True:
                try:
                    await step()
                except Exception:
                    logger.exception("model %s: %s failed", self.pool.model, step.__name__)
                await asyncio.sleep(interval_s)

        return repeat

    async def resolve(self) -> None:
        """Resolve the DNS name again; keep the replicas when it cannot be resolved."""
        source = self.source
        assert isinstance(source, DnsName)
        try:
            addresses = await self._resolver(source.host, source.port)
        except OSError as exc:
            if not self._resolve_failed:
                logger.warning("model %s: cannot resolve %s: %s", self.pool.model, source.host, exc)
            self._resolve_failed = True
            return
        self._resolve_failed = False
        if addresses:
            self.pool.update(source.endpoints(addresses))
        await self.probe()

    async def probe(self) -> None:
        """Ask every replica due for it whether its model is ready; eject stalled replicas."""
        now = self.pool.clock()
        due = [r for r in self.pool.replicas.values() if r.health.probe_due(now)]
        await asyncio.gather(*(self._probe(replica) for replica in due))
        self.pool.check_stalls()

    async def _probe(self, replica: Replica) -> None:
        try:
            async with asyncio.timeout(self.pool.settings.probe_timeout_s):
                ready = await self._backend.is_ready(replica.target)
        except TimeoutError:
            logger.debug("probe of %s timed out", replica.name)
            self.pool.probed(replica, False, timed_out=True)
            return
        except Exception as exc:
            logger.debug("probe of %s failed: %r", replica.name, exc)
            ready = False
        self.pool.probed(replica, ready)

    async def scrape(self) -> None:
        """Read every replica's TensorRT-LLM load signals from its Triton metrics."""
        replicas = [r for r in self.pool.replicas.values() if r.endpoint.metrics_url]
        await asyncio.gather(*(self._scrape(replica) for replica in replicas))
        if replicas:
            # An engine's waiting queue may have drained below ``max_waiting``.
            self.pool.capacity_may_grow()

    async def _scrape(self, replica: Replica) -> None:
        url = replica.endpoint.metrics_url
        assert url is not None
        try:
            response = await self._http.get(url, timeout=self.pool.settings.probe_timeout_s)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            logger.debug("metrics of %s unreadable: %r", replica.name, exc)
            return
        signals = parse_signals(response.text, self.pool.target.engine_model)
        if signals is not None:
            replica.signals = signals
            replica.signals_at = self.pool.clock()
