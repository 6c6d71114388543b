"""A request's stream over a pool: routed once admitted, counted, and retried once on another
replica when it fails before its first token (nothing has reached the client then)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

import anyio

from adapters.contract import (
    Backend,
    BackendUnavailable,
    GenerationRequest,
    InferenceFailed,
    ModelNotFound,
    TokenChunk,
)
from gateway.core.streams import CLEANUP_GRACE_S
from gateway.replicas.pool import Replica, ReplicaPool

RETRIED = (BackendUnavailable, ModelNotFound, InferenceFailed)
"""Failures before the first token that another replica may not have."""
EJECTING = (BackendUnavailable, ModelNotFound)
"""Failures that say the replica, not the request, is at fault."""


class ReplicaLost(BackendUnavailable):
    """The replica was ejected while the request waited there for its first token."""


class AttemptObserver(Protocol):
    """Who hears where a request's attempts went (the ``triton.generate`` span)."""

    def replica(self, name: str, address: str) -> None:
        """An attempt was sent to replica ``name`` at ``address``."""
        ...

    def failover(self, name: str, error: BaseException) -> None:
        """The attempt on ``name`` failed before its first token; another replica is tried."""
        ...


async def _close(chunks: AsyncIterator[TokenChunk]) -> None:
    if isinstance(chunks, AsyncGenerator):
        with anyio.move_on_after(CLEANUP_GRACE_S, shield=True):
            await chunks.aclose()


async def _first(chunks: AsyncIterator[TokenChunk], replica: Replica) -> TokenChunk | None:
    """The stream's first chunk (None when it has none), unless the replica is ejected first."""
    scope = asyncio.timeout(None)
    try:
        async with scope:
            replica.waiting_first.add(scope)
            try:
                return await anext(chunks)
            except StopAsyncIteration:
                return None
            finally:
                replica.waiting_first.discard(scope)
    except TimeoutError:
        if scope.expired():
            raise ReplicaLost(f"replica {replica.name} was ejected") from None
        raise


class PooledRequest:
    """A request for a pool: prepared on the replica picked once it is streamed, that is once
    it was admitted, so a refused request counts against no replica."""

    def __init__(
        self,
        pool: ReplicaPool,
        backend: Backend,
        request: GenerationRequest,
        observer: AttemptObserver | None = None,
    ) -> None:
        self._pool = pool
        self._backend = backend
        self._request = request
        self._observer = observer
        self.replica: Replica | None = None
        """The replica that answered (its first chunk), once one did."""

    def send(self) -> None:
        """Nothing goes before the replica is picked (``stream``)."""

    def discard(self) -> None:
        """Nothing was sent."""

    async def _attempt(
        self, replica: Replica
    ) -> tuple[AsyncIterator[TokenChunk], TokenChunk | None]:
        """The request sent to ``replica``: its stream and first chunk (None: it has none)."""
        if self._observer is not None:
            self._observer.replica(replica.name, replica.endpoint.url)
        replica.started(self._pool.clock())
        chunks: AsyncIterator[TokenChunk] | None = None
        try:
            prepared = await self._backend.prepare(replica.target, self._request)
            chunks = prepared.stream()
            return chunks, await _first(chunks, replica)
        except BaseException:
            replica.ended()
            if chunks is not None:
                await _close(chunks)
            raise

    async def stream(self) -> AsyncGenerator[TokenChunk, None]:
        """The chunks from a replica of the pool; one failure before the first token moves the
        request to another replica, later failures end it (in-band for a running stream)."""
        pool, tried = self._pool, list[Replica]()
        while True:
            replica = pool.pick(self._request, exclude=tried).replica
            try:
                chunks, first = await self._attempt(replica)
                break
            except RETRIED as exc:
                if isinstance(exc, EJECTING) and not isinstance(exc, ReplicaLost):
                    pool.failed(replica, "unavailable")
                if tried or len(pool.replicas) < 2:
                    raise
                tried.append(replica)
                replica.retries += 1
                if self._observer is not None:
                    self._observer.failover(replica.name, exc)
        self.replica = replica
        try:
            if first is None:
                return
            clock = pool.clock
            replica.last_progress = clock()
            yield first
            async for chunk in chunks:
                replica.last_progress = clock()
                yield chunk
        except EJECTING:
            pool.failed(replica, "unavailable")
            raise
        finally:
            replica.ended()
            await _close(chunks)


async def prepare(
    pool: ReplicaPool,
    backend: Backend,
    observer: AttemptObserver | None,
    request: GenerationRequest,
) -> PooledRequest:
    """``request`` ready for ``pool``: nothing is encoded before its replica is picked."""
    return PooledRequest(pool, backend, request, observer)


def stream(
    pool: ReplicaPool,
    backend: Backend,
    request: GenerationRequest,
    observer: AttemptObserver | None = None,
) -> AsyncGenerator[TokenChunk, None]:
    """The chunks of an admitted ``request`` from a replica of ``pool``."""
    return PooledRequest(pool, backend, request, observer).stream()
