"""A ``Backend`` that replays scripted chunks: the test double of the backend seam.

Shipped beside the contract it stands in for (as httpx ships ``MockTransport``), so unit tests
and in-process benchmarks drive the gateway without a Triton server. It records every request,
the server each went to, and which streams their consumer closed before the end. Servers listed
in ``down`` are unreachable, those in ``hung`` accept requests and never answer; a
``BackendError`` in the script is raised where it stands.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

from adapters.contract import (
    BackendError,
    BackendUnavailable,
    GenerationRequest,
    ModelTarget,
    TokenChunk,
)

Step = TokenChunk | BackendError
ChunkScript = Sequence[Step] | Callable[[GenerationRequest], Sequence[Step]]


class ScriptedBackend:
    """Answers every request with the same chunks, or with ``script(request)``'s.

    ``delay_s`` is waited before each chunk; ``ready`` is what ``is_ready`` answers for servers
    not in ``down``, whose requests fail with ``BackendUnavailable`` before any chunk.
    """

    def __init__(self, script: ChunkScript, *, delay_s: float = 0.0, ready: bool = True) -> None:
        self._script = script
        self.delay_s = delay_s
        self.ready = ready
        self.down: set[str] = set()
        """URLs of servers that cannot be reached."""
        self.hung: set[str] = set()
        """URLs of servers that take requests and never answer."""
        self.requests: list[GenerationRequest] = []
        self.urls: list[str] = []
        """The server each request went to."""
        self.closed_early: list[str] = []
        self.closed = False

    def chunks_for(self, request: GenerationRequest) -> Sequence[Step]:
        """The chunks ``request`` is answered with."""
        return self._script(request) if callable(self._script) else self._script

    async def generate(
        self, target: ModelTarget, request: GenerationRequest
    ) -> AsyncIterator[TokenChunk]:
        """Replay the script; a stream closed before its end is recorded in ``closed_early``
        (a request sent ahead of its admission and refused included)."""
        if not request.send_ahead:
            await request.wait_admitted()
        self.requests.append(request)
        self.urls.append(target.url)
        if target.url in self.down:
            raise BackendUnavailable(f"{target.url}: failed to connect")
        finished = False
        try:
            if request.send_ahead:
                await request.wait_admitted()
            if target.url in self.hung:
                await asyncio.Event().wait()
            for step in self.chunks_for(request):
                # Even at 0 this yields to the loop, as a real stream does between chunks.
                await asyncio.sleep(self.delay_s)
                if isinstance(step, BackendError):
                    raise step
                yield step
            finished = True
        finally:
            if not finished:
                self.closed_early.append(request.request_id)

    async def is_ready(self, target: ModelTarget) -> bool:
        """``ready``, for every server not in ``down``; a ``hung`` one never answers."""
        if target.url in self.hung:
            await asyncio.Event().wait()
        return self.ready and target.url not in self.down

    async def close(self) -> None:
        """Nothing to release; remembers it was called."""
        self.closed = True
