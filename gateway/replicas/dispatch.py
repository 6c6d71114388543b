"""A request's stream over a pool: routed, counted, and retried once on another replica when it
fails before its first token (nothing has reached the client then)."""

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


async def stream(
    pool: ReplicaPool,
    backend: Backend,
    request: GenerationRequest,
    observer: AttemptObserver | None = None,
) -> AsyncGenerator[TokenChunk, None]:
    """The chunks of ``request`` from a replica of ``pool``; one failure before the first
    token moves it to another replica, later failures end it (in-band for a running stream)."""
    # Admitted before a replica is picked, a refused request counting against none; or, sent
    # ahead of its admission, stopped by a refusal as its first chunk is awaited.
    if not request.send_ahead:
        await request.wait_admitted()
    tried: list[Replica] = []
    while True:
        replica = pool.pick(request, exclude=tried).replica
        if observer is not None:
            observer.replica(replica.name, replica.endpoint.url)
        replica.started(pool.clock())
        chunks = backend.generate(replica.target, request)
        try:
            first = await _first(chunks, replica)
            break
        except RETRIED as exc:
            replica.ended()
            await _close(chunks)
            if isinstance(exc, EJECTING) and not isinstance(exc, ReplicaLost):
                pool.failed(replica, "unavailable")
            if tried or len(pool.replicas) < 2:
                raise
            tried.append(replica)
            replica.retries += 1
            if observer is not None:
                observer.failover(replica.name, exc)
        except BaseException:
            replica.ended()
            await _close(chunks)
            raise
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
