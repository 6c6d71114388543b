"""Every pool of the app: built from the served models, watched while the app runs, and the
small interface the request path calls (``pool``, ``preparer``)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Protocol

import httpx

from adapters.contract import Backend, GenerationRequest, ModelTarget, PreparedRequest
from gateway.replicas import dispatch
from gateway.replicas.dispatch import AttemptObserver
from gateway.replicas.pool import Clock, ReplicaPool
from gateway.replicas.settings import RoutingSettings
from gateway.replicas.sources import ReplicaSource, Resolver, resolve_addresses
from gateway.replicas.watch import PoolWatch

logger = logging.getLogger(__name__)


class PooledModel(Protocol):
    """A served model as the router reads it (``ModelRoute``)."""

    @property
    def name(self) -> str: ...

    @property
    def target(self) -> ModelTarget: ...

    @property
    def replicas(self) -> ReplicaSource | None: ...

    @property
    def routing(self) -> RoutingSettings: ...


class Router:
    """The replica pools of the models served by several Tritons (none for the others)."""

    def __init__(
        self,
        models: Iterable[PooledModel],
        *,
        retry_after_s: int = 5,
        resolver: Resolver = resolve_addresses,
        clock: Clock | None = None,
    ) -> None:
        self._pools: dict[str, ReplicaPool] = {}
        self._sources: dict[str, ReplicaSource] = {}
        self._resolver = resolver
        self._tasks: list[asyncio.Task[None]] = []
        for model in models:
            if model.replicas is None:
                continue
            extra = {"clock": clock} if clock is not None else {}
            self._pools[model.name] = ReplicaPool(
                model.name, model.target, model.routing, retry_after_s=retry_after_s, **extra
            )
            self._sources[model.name] = model.replicas

    def __iter__(self) -> Iterator[ReplicaPool]:
        return iter(self._pools.values())

    def __bool__(self) -> bool:
        return bool(self._pools)

    def pool(self, model: str) -> ReplicaPool | None:
        """The pool of the base model ``model``; None when it has one Triton."""
        return self._pools.get(model)

    def start(self, backend: Backend, http: httpx.AsyncClient) -> None:
        """Start probing, scraping and resolving every pool's replicas."""
        for name, pool in self._pools.items():
            watch = PoolWatch(pool, self._sources[name], backend, http, self._resolver)
            for loop in watch.loops():
                self._tasks.append(asyncio.create_task(loop(), name=f"replicas-{name}"))

    async def close(self) -> None:
        """Stop the background work."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def preparer(
        self, model: str, backend: Backend, observer: AttemptObserver | None = None
    ) -> Callable[[GenerationRequest], Awaitable[PreparedRequest]] | None:
        """How requests of the base model ``model`` are prepared for its pool (their replica
        picked once they are admitted); None when it has one Triton."""
        pool = self._pools.get(model)
        if pool is None:
            return None
        return functools.partial(dispatch.prepare, pool, backend, observer)
