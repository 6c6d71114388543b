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
        self.released: list[tuple[str, bytes]] = []
        """(server, handoff) of each context phase whose handoff was released."""
        self.closed = False

    def chunks_for(self, request: GenerationRequest) -> Sequence[Step]:
        """The chunks ``request`` is answered with."""
        return self._script(request) if callable(self._script) else self._script

    async def prepare(self, target: ModelTarget, request: GenerationRequest) -> ScriptedRequest:
        """A request ready to replay its script; nothing is recorded until it is sent."""
        return ScriptedRequest(self, target, request)

    async def generate(
        self, target: ModelTarget, request: GenerationRequest
    ) -> AsyncIterator[TokenChunk]:
        """Prepare and stream at once."""
        async for chunk in (await self.prepare(target, request)).stream():
            yield chunk

    async def is_ready(self, target: ModelTarget) -> bool:
        """``ready``, for every server not in ``down``; a ``hung`` one never answers."""
        if target.url in self.hung:
            await asyncio.Event().wait()
        return self.ready and target.url not in self.down

    def release_handoff(self, target: ModelTarget, handoff: bytes) -> None:
        """Record the release (``released``)."""
        self.released.append((target.url, handoff))

    async def close(self) -> None:
        """Nothing to release; remembers it was called."""
        self.closed = True


class ScriptedRequest:
    """One request of a ``ScriptedBackend``: recorded (``requests``, ``urls``) once sent; a
    stream closed before its end, or a sent request discarded unread, in ``closed_early``."""

    def __init__(
        self, backend: ScriptedBackend, target: ModelTarget, request: GenerationRequest
    ) -> None:
        self._backend = backend
        self._target = target
        self._request = request
        self._sent = False
        self._finished = False

    def send(self) -> None:
        """Record the request as sent to its server."""
        if not self._sent:
            self._sent = True
            self._backend.requests.append(self._request)
            self._backend.urls.append(self._target.url)

    async def stream(self) -> AsyncIterator[TokenChunk]:
        """Replay the script (``BackendUnavailable`` at once from a server in ``down``)."""
        backend, url = self._backend, self._target.url
        self.send()
        if url in backend.down:
            self._finished = True
            raise BackendUnavailable(f"{url}: failed to connect")
        try:
            if url in backend.hung:
                await asyncio.Event().wait()
            for step in backend.chunks_for(self._request):
                # Even at 0 this yields to the loop, as a real stream does between chunks.
                await asyncio.sleep(backend.delay_s)
                if isinstance(step, BackendError):
                    raise step
                yield step
            self._finished = True
        finally:
            self.discard()

    def discard(self) -> None:
        """A request sent and not read to its end counts as closed early (once)."""
        if self._sent and not self._finished:
            self._finished = True
            self._backend.closed_early.append(self._request.request_id)
