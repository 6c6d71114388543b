"""A request of a disaggregated model over two pools: its context phase (the prefill and first
token) on a replica of the context pool, its generation phase on a replica of the generation
pool taking the KV cache the context phase handed over; one stream for the caller.

A request the split cannot serve (a short prompt, a beam search, a prompt with images, an entry
other than ``tensorrt_llm``) runs whole on the generation pool. Each phase is a pooled request
(``dispatch.PooledRequest``): a context failure before the first token is retried on another
context replica. A generation phase that fails before anything reached the caller (a whole
answer, the handoff lost) is run again whole; once the first token was streamed, its failure
ends the stream in-band like any other.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

from adapters.contract import (
    Backend,
    BackendError,
    GenerationRequest,
    TokenChunk,
)
from gateway.replicas.dispatch import AttemptObserver, PooledRequest
from gateway.replicas.pool import ReplicaPool

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PhasePools:
    """The two pools of a disaggregated model and the shortest prompt worth splitting."""

    context: ReplicaPool
    generation: ReplicaPool
    min_prompt_tokens: int = 0


def splits(request: GenerationRequest, pools: PhasePools) -> bool:
    """Whether ``request`` runs as two phases: a prompt of token ids at least
    ``min_prompt_tokens`` long, without a beam search or images (the engine does not split
    them), to the ``tensorrt_llm`` entry."""
    if pools.context.target.kind != "tensorrt_llm" or not request.prompt_ids:
        return False
    if request.params.beam is not None or request.images:
        return False
    return len(request.prompt_ids) >= max(pools.min_prompt_tokens, 1)


class DisaggregatedRequest:
    """A request for a disaggregated model: nothing is sent before it is streamed (admitted)."""

    def __init__(
        self,
        pools: PhasePools,
        backend: Backend,
        request: GenerationRequest,
        observer: AttemptObserver | None = None,
    ) -> None:
        self._pools = pools
        self._backend = backend
        self._request = request
        self._observer = observer

    def send(self) -> None:
        """Nothing goes before a replica is picked (``stream``)."""

    def discard(self) -> None:
        """Nothing was sent."""

    def _pooled(self, pool: ReplicaPool, request: GenerationRequest) -> PooledRequest:
        return PooledRequest(pool, self._backend, request, self._observer)

    async def stream(self) -> AsyncGenerator[TokenChunk, None]:
        """The request's chunks: both phases where it splits, else the whole request."""
        request = self._request
        if not splits(request, self._pools):
            async with aclosing(self._pooled(self._pools.generation, request).stream()) as whole:
                async for chunk in whole:
                    yield chunk
            return
        context = await self._context()
        if context is None:
            return
        handoff = context.context_phase_params
        if handoff is None or request.params.max_tokens <= 1:
            # The first token ends the answer: nothing is left for a generation phase.
            yield dataclasses.replace(context, final=True, context_phase_params=None)
            return
        if request.stream:
            yield dataclasses.replace(context, final=False, context_phase_params=None)
        generation = dataclasses.replace(
            request, phase="generation_only", context_phase_params=handoff
        )
        sent = request.stream
        try:
            async with aclosing(self._pooled(self._pools.generation, generation).stream()) as rest:
                async for chunk in rest:
                    sent = True
                    yield chunk
        except BackendError as exc:
            if sent:
                raise
            logger.warning("the handoff of %s was lost (%s): run whole", request.request_id, exc)
        else:
            return
        async with aclosing(self._pooled(self._pools.generation, request).stream()) as whole:
            async for chunk in whole:
                yield chunk

    async def _context(self) -> TokenChunk | None:
        """The context phase's one answer: the first token and the handoff."""
        phase = dataclasses.replace(self._request, phase="context_only")
        answer: TokenChunk | None = None
        async with aclosing(self._pooled(self._pools.context, phase).stream()) as chunks:
            async for chunk in chunks:
                if answer is None or chunk.token_count or chunk.context_phase_params:
                    answer = _merged(answer, chunk)
        return answer


def _merged(earlier: TokenChunk | None, chunk: TokenChunk) -> TokenChunk:
    """The context answer's chunks as one (an empty closing response after the answer)."""
    if earlier is None:
        return chunk
    return dataclasses.replace(
        chunk,
        text=earlier.text + chunk.text,
        token_count=(earlier.token_count or 0) + (chunk.token_count or 0),
        logprobs=earlier.logprobs + chunk.logprobs,
        context_phase_params=chunk.context_phase_params or earlier.context_phase_params,
        prompt_tokens=chunk.prompt_tokens or earlier.prompt_tokens,
        cached_tokens=earlier.cached_tokens if chunk.cached_tokens is None else chunk.cached_tokens,
    )


async def prepare(
    pools: PhasePools,
    backend: Backend,
    observer: AttemptObserver | None,
    request: GenerationRequest,
) -> DisaggregatedRequest:
    """``request`` ready for a disaggregated model's pools: nothing is encoded before its
    replicas are picked."""
    return DisaggregatedRequest(pools, backend, request, observer)
