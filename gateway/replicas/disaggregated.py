"""A request of a disaggregated model over two pools: its context phase (the prefill and first
token) on a replica of the context pool, its generation phase on a replica of the generation
pool taking the KV cache the context phase handed over; one stream for the caller.

A request the split cannot serve (a short prompt, a beam search, a prompt with images, an entry
other than ``tensorrt_llm``) runs whole on the generation pool. Each phase is a pooled request
(``dispatch.PooledRequest``): a context failure before the first token is retried on another
context replica. A generation phase that fails before anything reached the caller (a whole
answer, the handoff lost) is run again whole; once the first token was streamed, its failure
ends the stream in-band like any other. A generation phase that ends before answering (the
caller gone, a failure) has the context replica free the blocks it holds for it at once.

An observer (``SplitObserver``: the request's metrics and spans) hears how each request runs,
where each phase went and how it ended.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Literal, Protocol

from adapters.contract import (
    Backend,
    BackendError,
    DisaggregationPhase,
    GenerationRequest,
    TokenChunk,
)
from gateway.replicas.dispatch import AttemptObserver, PooledRequest
from gateway.replicas.pool import Replica, ReplicaPool

logger = logging.getLogger(__name__)

SplitDecision = Literal[
    "split", "whole_short_prompt", "whole_beam_search", "whole_images", "whole_no_prompt_ids"
]
"""How a request of a disaggregated model runs: split, or whole and why."""


class PhaseObserver(AttemptObserver, Protocol):
    """Who hears where one phase of a split request went and how it ended (its span)."""

    def trace_headers(self) -> dict[str, str]:
        """Trace context for the phase's Triton call."""
        ...

    def ended(self, outcome: str, error: BaseException | None = None) -> None:
        """The phase ended: ``answered``, ``failed``, ``cancelled``, ``handoff_lost`` or
        ``ended_in_band``."""
        ...


class SplitObserver(AttemptObserver, Protocol):
    """Who hears how a disaggregated model's request runs (metrics, spans)."""

    def decided(self, model: str, decision: str) -> None:
        """The request runs split or whole (``SplitDecision``)."""
        ...

    def phase(self, model: str, phase: str) -> PhaseObserver:
        """A phase (``context``, ``generation``) of a split request starts."""
        ...

    def handed_over(self, model: str, seconds: float) -> None:
        """A streamed generation phase first answered ``seconds`` after the context phase."""
        ...


@dataclass(frozen=True, slots=True)
class PhasePools:
    """The two pools of a disaggregated model and the shortest prompt worth splitting."""

    context: ReplicaPool
    generation: ReplicaPool
    min_prompt_tokens: int = 0


def decide(request: GenerationRequest, pools: PhasePools) -> SplitDecision:
    """Whether ``request`` runs as two phases: a prompt of token ids at least
    ``min_prompt_tokens`` long, without a beam search or images (the engine does not split
    them), to the ``tensorrt_llm`` entry."""
    if pools.context.target.kind != "tensorrt_llm" or not request.prompt_ids:
        return "whole_no_prompt_ids"
    if request.params.beam is not None:
        return "whole_beam_search"
    if request.images:
        return "whole_images"
    if len(request.prompt_ids) < max(pools.min_prompt_tokens, 1):
        return "whole_short_prompt"
    return "split"


def splits(request: GenerationRequest, pools: PhasePools) -> bool:
    """Whether ``request`` runs as two phases (``decide``)."""
    return decide(request, pools) == "split"


class DisaggregatedRequest:
    """A request for a disaggregated model: nothing is sent before it is streamed (admitted)."""

    def __init__(
        self,
        pools: PhasePools,
        backend: Backend,
        request: GenerationRequest,
        observer: SplitObserver | None = None,
    ) -> None:
        self._pools = pools
        self._backend = backend
        self._request = request
        self._observer = observer
        self._model = pools.generation.model

    def send(self) -> None:
        """Nothing goes before a replica is picked (``stream``)."""

    def discard(self) -> None:
        """Nothing was sent."""

    def _pooled(
        self, pool: ReplicaPool, request: GenerationRequest, observer: AttemptObserver | None
    ) -> PooledRequest:
        return PooledRequest(pool, self._backend, request, observer)

    def _phase(
        self, name: str, kind: DisaggregationPhase, request: GenerationRequest
    ) -> tuple[GenerationRequest, Phase]:
        """``request`` as phase ``name`` (TensorRT-LLM's ``kind``), with its observer (whose
        span its Triton call is traced under)."""
        observer = self._observer.phase(self._model, name) if self._observer else None
        request = dataclasses.replace(request, phase=kind)
        if observer is not None:
            headers = {**request.trace_headers, **observer.trace_headers()}
            request = dataclasses.replace(request, trace_headers=headers)
        return request, Phase(observer)

    async def stream(self) -> AsyncGenerator[TokenChunk, None]:
        """The request's chunks: both phases where it splits, else the whole request."""
        decision = decide(self._request, self._pools)
        if self._observer is not None:
            self._observer.decided(self._model, decision)
        chunks = self._split() if decision == "split" else self._whole()
        async with aclosing(chunks) as answer:
            async for chunk in answer:
                yield chunk

    async def _split(self) -> AsyncGenerator[TokenChunk, None]:
        """The context phase's first token, then the generation phase's; the whole request
        where the handoff was lost before anything reached the caller."""
        request = self._request
        answered = await self._context()
        if answered is None:
            return
        context, replica = answered
        handoff = context.context_phase_params
        if handoff is None or request.params.max_tokens <= 1:
            # The first token ends the answer: nothing is left for a generation phase.
            if handoff is not None:
                self._backend.release_handoff(replica.target, handoff)
            yield dataclasses.replace(context, final=True, context_phase_params=None)
            return
        if request.stream:
            yield dataclasses.replace(context, final=False, context_phase_params=None)
        generation, phase = self._phase("generation", "generation_only", request)
        generation = dataclasses.replace(generation, context_phase_params=handoff)
        async with aclosing(self._generation(generation, phase, replica)) as rest:
            async for chunk in rest:
                yield chunk
        if phase.outcome == "handoff_lost":
            async with aclosing(self._whole()) as whole:
                async for chunk in whole:
                    yield chunk

    async def _generation(
        self, request: GenerationRequest, phase: Phase, context: Replica
    ) -> AsyncGenerator[TokenChunk, None]:
        """The generation phase's chunks; a failure before any reached the caller is the
        ``handoff_lost`` outcome (the caller runs the request whole), raised after. ``context``
        holds the handoff the request carries."""
        answered_at = time.monotonic()
        sent, started = request.stream, False
        pooled = self._pooled(self._pools.generation, request, phase.observer)
        try:
            async with aclosing(pooled.stream()) as chunks:
                async for chunk in chunks:
                    # A whole answer's one response comes at its end: only a stream's first
                    # tells when the generation phase started.
                    if not started and request.stream and self._observer is not None:
                        self._observer.handed_over(self._model, time.monotonic() - answered_at)
                    started = sent = True
                    yield chunk
            phase.outcome = "answered"
        except BackendError as exc:
            phase.fail("ended_in_band" if sent else "handoff_lost", exc)
            if sent:
                raise
            logger.warning("the handoff of %s was lost (%s): run whole", request.request_id, exc)
        except Exception as exc:
            phase.fail("failed", exc)
            raise
        finally:
            if not started and request.context_phase_params is not None:
                # The context replica holds the prompt's blocks for a generation phase that
                # will not take them: freed now rather than after kv_transfer_timeout_ms.
                self._backend.release_handoff(context.target, request.context_phase_params)
            phase.end()

    def _whole(self) -> AsyncGenerator[TokenChunk, None]:
        return self._pooled(self._pools.generation, self._request, self._observer).stream()

    async def _context(self) -> tuple[TokenChunk, Replica] | None:
        """The context phase's one answer (the first token and the handoff) and the replica
        that holds the handoff; None when it answered nothing."""
        request, phase = self._phase("context", "context_only", self._request)
        pooled = self._pooled(self._pools.context, request, phase.observer)
        answer: TokenChunk | None = None
        try:
            async with aclosing(pooled.stream()) as chunks:
                async for chunk in chunks:
                    if answer is None or chunk.token_count or chunk.context_phase_params:
                        answer = _merged(answer, chunk)
            phase.outcome = "answered"
        except Exception as exc:
            phase.fail("failed", exc)
            raise
        finally:
            phase.end()
        if answer is None or pooled.replica is None:
            return None
        return answer, pooled.replica


@dataclass(slots=True)
class Phase:
    """How one phase is ending: ``cancelled`` unless it answered or failed."""

    observer: PhaseObserver | None
    outcome: str = "cancelled"
    error: BaseException | None = None

    def fail(self, outcome: str, error: BaseException) -> None:
        self.outcome, self.error = outcome, error

    def end(self) -> None:
        if self.observer is not None:
            self.observer.ended(self.outcome, self.error)


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
    observer: SplitObserver | None,
    request: GenerationRequest,
) -> DisaggregatedRequest:
    """``request`` ready for a disaggregated model's pools: nothing is encoded before its
    replicas are picked."""
    return DisaggregatedRequest(pools, backend, request, observer)
