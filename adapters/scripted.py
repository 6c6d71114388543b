"""A ``Backend`` that replays scripted chunks: the test double of the backend seam.

Shipped beside the contract it stands in for (as httpx ships ``MockTransport``), so unit tests
and in-process benchmarks drive the gateway without a Triton server. It records every request
and which streams their consumer closed before the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

from adapters.contract import GenerationRequest, ModelTarget, TokenChunk

Script = Sequence[TokenChunk] | Callable[[GenerationRequest], Sequence[TokenChunk]]


class ScriptedBackend:
    """Answers every request with the same chunks, or with ``script(request)``'s.

    ``delay_s`` is waited before each chunk; ``ready`` is what ``is_ready`` answers.
    """

    def __init__(self, script: Script, *, delay_s: float = 0.0, ready: bool = True) -> None:
        self._script = script
        self.delay_s = delay_s
        self.ready = ready
        self.requests: list[GenerationRequest] = []
        self.closed_early: list[str] = []
        self.closed = False

    def chunks_for(self, request: GenerationRequest) -> Sequence[TokenChunk]:
        """The chunks ``request`` is answered with."""
        return self._script(request) if callable(self._script) else self._script

    async def generate(
        self, target: ModelTarget, request: GenerationRequest
    ) -> AsyncIterator[TokenChunk]:
        """Replay the script; a stream closed before its end is recorded in ``closed_early``."""
        self.requests.append(request)
        finished = False
        try:
            for chunk in self.chunks_for(request):
                # Even at 0 this yields to the loop, as a real stream does between chunks.
                await asyncio.sleep(self.delay_s)
                yield chunk
            finished = True
        finally:
            if not finished:
                self.closed_early.append(request.request_id)

    async def is_ready(self, target: ModelTarget) -> bool:
        """``ready``, for every target."""
        return self.ready

    async def close(self) -> None:
        """Nothing to release; remembers it was called."""
        self.closed = True
