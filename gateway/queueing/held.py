"""A request's stream inside a slot of its model: the slot taken before the request is
dispatched (waiting in the fair queue when the model is full), given back when it ends."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable

import anyio

from adapters.contract import GenerationRequest, TokenChunk
from gateway.core.streams import CLEANUP_GRACE_S
from gateway.queueing.flows import current_flow
from gateway.queueing.gate import ANONYMOUS, ModelSlots


def expected_cost(request: GenerationRequest) -> int:
    """Tokens a request is charged when dispatched, settled against what it used at its end:
    its prompt and the most it may generate."""
    prompt = request.prompt_tokens or len(request.prompt_ids)
    return prompt + request.params.max_tokens


async def held(
    slots: ModelSlots,
    request: GenerationRequest,
    dispatch: Callable[[], AsyncIterator[TokenChunk]],
) -> AsyncGenerator[TokenChunk, None]:
    """The chunks of ``dispatch()``, started once ``request`` holds a slot of ``slots``."""
    flow = current_flow.get() or ANONYMOUS
    cost = expected_cost(request)
    slot = slots.try_acquire(flow, cost)
    if slot is None:
        # A request about to wait is admitted first: one that its tenant's limits refuse
        # never holds a place in the queue.
        if not request.send_ahead:
            await request.wait_admitted()
        slot = await slots.acquire(flow, cost)
    prompt = request.prompt_tokens or len(request.prompt_ids)
    generated: int | None = 0
    chunks = dispatch()
    try:
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
        slots.release(slot, slot.charged if generated is None else prompt + generated)
