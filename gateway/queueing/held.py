"""A prepared request inside a slot of its model: the slot taken before the request is sent
(waiting in the fair queue when the model is full, once the request was admitted), given back
when its stream ends."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import anyio

from adapters.contract import GenerationRequest, PreparedRequest, TokenChunk
from gateway.core.streams import CLEANUP_GRACE_S
from gateway.queueing.gate import ModelSlots, Slot
from gateway.queueing.scheduler import Flow


def expected_cost(request: GenerationRequest) -> int:
    """Tokens a request is charged when dispatched, settled against what it used at its end:
    its prompt and the most it may generate."""
    prompt = request.prompt_tokens or len(request.prompt_ids)
    return prompt + request.params.max_tokens


class HeldRequest:
    """``prepared``, sent only once it holds one of ``slots``.

    The core streams a request once its tenant admitted it, so a request that waits in the
    queue was admitted first: one its tenant's limits refuse never holds a place there. Sent
    ahead of its admission (``send``), it goes only where a slot is free at once.
    """

    def __init__(
        self,
        slots: ModelSlots,
        flow: Flow,
        request: GenerationRequest,
        prepared: PreparedRequest,
    ) -> None:
        self._slots = slots
        self._flow = flow
        self._request = request
        self._prepared = prepared
        self._cost = expected_cost(request)
        self._slot: Slot | None = None

    def send(self) -> None:
        """Send now where a slot is free without waiting; else the request waits its turn
        in ``stream``."""
        if self._slot is None:
            self._slot = self._slots.try_acquire(self._flow, self._cost)
        if self._slot is not None:
            self._prepared.send()

    def discard(self) -> None:
        self._prepared.discard()
        if self._slot is not None:
            self._slots.release(self._slot, self._slot.charged)

    async def stream(self) -> AsyncGenerator[TokenChunk, None]:
        """The request's chunks, once it holds a slot; the slot is given back at the end,
        charged what the request used."""
        slot = self._slot or await self._slots.acquire(self._flow, self._cost)
        self._slot = slot
        request = self._request
        prompt = request.prompt_tokens or len(request.prompt_ids)
        generated: int | None = 0
        chunks: AsyncIterator[TokenChunk] | None = None
        try:
            chunks = self._prepared.stream()
            async for chunk in chunks:
                count = chunk.token_count
                generated = None if generated is None or count is None else generated + count
                prompt = chunk.prompt_tokens or prompt
                yield chunk
        finally:
            # Closed first: the engine's sequence ends before its slot goes to the next request.
            if isinstance(chunks, AsyncGenerator):
                with anyio.move_on_after(CLEANUP_GRACE_S, shield=True):
                    await chunks.aclose()
            # A deployment that does not count tokens is charged what was expected.
            self._slots.release(slot, slot.charged if generated is None else prompt + generated)
