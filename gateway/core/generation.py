"""The request path's core: a plan's backend requests prepared, admitted, then streamed as
neutral events (text deltas and endings), observed and metered.

Each backend request goes through three phases, all of them here: *prepare* (encoded for its
server by the backend, while the tenant's admission is answered), *admit* (that answer awaited;
a refusal sends nothing), *stream*. An admission all but sure to admit (``expected``) lets the
prepared requests go before its answer: a refusal then stops them before anything of them is
read. A model with a replica pool prepares its requests through the pool (``Dispatcher``),
which picks the replica once the request is admitted.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Protocol

from adapters.contract import Backend, GenerationRequest, PreparedRequest
from gateway.core.choices import Choice, ChoiceReader, beam_events, choice_events
from gateway.core.events import ChoiceEnd, ChoiceResult, Event, UsageMeter, fold
from gateway.core.plan import ChoiceSpec, Plan
from gateway.core.ports import Dispatcher, GeneratedModel, PendingAdmission, Prepare
from gateway.core.streams import merge
from gateway.ids import random_hex
from gateway.observability import GenerationWatch, Observability, ObservabilitySettings

Placement = tuple[int, int | None]
"""A request's Triton priority (0: the model's default) and KV-cache salt."""


class EventSource(Protocol):
    """A request's events as the core reads them, one ``next`` at a time (None: the end)."""

    async def next(self) -> Event | None: ...

    async def close(self) -> None: ...


class _Merged:
    """Several choices' interleaved events (``merge``), read as an ``EventSource``."""

    def __init__(self, events: AsyncGenerator[Event, None]) -> None:
        self._events = events

    async def next(self) -> Event | None:
        return await anext(self._events, None)

    async def close(self) -> None:
        await self._events.aclose()


class GenerationService:
    """Turns a plan into one event stream over the backend."""

    def __init__(
        self,
        backend: Backend,
        *,
        timeout_s: float,
        observability: Observability | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self._backend = backend
        self._timeout_s = timeout_s
        self._observability = observability or Observability(ObservabilitySettings())
        self._dispatcher = dispatcher

    def events(
        self,
        model: GeneratedModel,
        plan: Plan,
        meter: UsageMeter | None = None,
        *,
        priority: int = 0,
        cache_salt: int | None = None,
        admission: PendingAdmission | None = None,
    ) -> AsyncGenerator[Event, None]:
        """Every choice's events, interleaved as they arrive; closing it cancels the requests.

        ``meter`` counts the tokens used as they are generated; ``priority`` is the Triton
        request priority (0: the model's default); ``cache_salt`` the salt of the caller's
        KV-cache scope (``GenerationRequest.cache_salt``); ``admission`` is awaited once the
        requests are prepared, and nothing is sent before it admits (unless it is
        ``expected`` to: see the module's docstring).
        """
        return self._generate(model, plan, meter or UsageMeter(), (priority, cache_salt), admission)

    async def collect(self, model: GeneratedModel, plan: Plan) -> list[ChoiceResult]:
        """Run a plan to the end and fold each choice's events."""
        return await fold(plan, self.events(model, plan))

    async def _generate(
        self,
        model: GeneratedModel,
        plan: Plan,
        meter: UsageMeter,
        placement: Placement,
        admission: PendingAdmission | None,
    ) -> AsyncGenerator[Event, None]:
        # Everything starts at the first iteration, so an unconsumed generator leaves no span.
        request_id = random_hex(16)
        watch = self._observability.generation(
            {
                "gen_ai.request.model": model.name,
                "gen_ai.request.max_tokens": plan.choices[0].params.max_tokens,
                "gen_ai.request.choice.count": len(plan.choices),
                "triton.model": model.target.triton_model,
                "triton.request_id": request_id,
            },
            sent=admission is None,
        )
        error: BaseException | None = None
        unfinished = {spec.index for spec in plan.choices}
        prepared: list[PreparedRequest] = []
        try:
            groups = _groups(plan)
            trace_headers = watch.trace_headers()
            requests = [
                self._request(model, plan, specs[0], request_id, placement, trace_headers)
                for specs in groups
            ]
            prepared = await _prepare(self._preparer(model, watch), requests, admission)
            await _admit(prepared, admission, watch)
            if len(groups) == 1 and plan.choices[0].params.beam is None:
                choice = Choice(
                    plan.choices[0], model.tokenizer, logprobs=plan.logprobs, meter=meter
                )
                source: EventSource = ChoiceReader(choice, prepared[0].stream(), self._timeout_s)
            else:
                source = _Merged(self._several(model, plan, meter, groups, prepared))
            try:
                while (event := await source.next()) is not None:
                    if isinstance(event, ChoiceEnd):
                        unfinished.discard(event.index)
                        watch.ended(
                            event.prompt_index,
                            event.prompt_tokens,
                            event.completion_tokens,
                            event.cached_tokens or 0,
                        )
                    elif event.text:
                        watch.text(event.index)
                    yield event
            finally:
                await source.close()
        except BaseException as exc:
            error = exc
            raise
        finally:
            # A stream that never started (its task cancelled first) still releases its request.
            for request in prepared:
                request.discard()
            # What reached the client, or was generated, counts however the call ended.
            cut = sum(meter.choices.get(index, 0) for index in unfinished)
            watch.cut_short(meter.prompts, cut)
            watch.close(error)

    def _several(
        self,
        model: GeneratedModel,
        plan: Plan,
        meter: UsageMeter,
        groups: Sequence[Sequence[ChoiceSpec]],
        prepared: Sequence[PreparedRequest],
    ) -> AsyncGenerator[Event, None]:
        """The events of several choices (or a beam search's), interleaved under the deadline."""
        tokenizer, logprobs = model.tokenizer, plan.logprobs
        if plan.choices[0].params.beam is not None:
            streams = [
                beam_events(specs, p.stream(), tokenizer, logprobs=logprobs, meter=meter)
                for specs, p in zip(groups, prepared, strict=True)
            ]
        else:
            streams = [
                choice_events(
                    Choice(specs[0], tokenizer, logprobs=logprobs, meter=meter), p.stream()
                )
                for specs, p in zip(groups, prepared, strict=True)
            ]
        return merge(streams, self._timeout_s)

    def _request(
        self,
        model: GeneratedModel,
        plan: Plan,
        spec: ChoiceSpec,
        request_id: str,
        placement: Placement,
        trace_headers: Mapping[str, str],
    ) -> GenerationRequest:
        priority, cache_salt = placement
        return GenerationRequest(
            request_id=f"{request_id}-{spec.index}",
            prompt=spec.prompt.text,
            prompt_ids=spec.prompt.ids,
            tokens=model.tokenizer if model.target.kind == "tensorrt_llm" else None,
            params=spec.params,
            stream=plan.stream,
            timeout_s=self._timeout_s,
            priority=priority,
            cache_salt=cache_salt,
            lora=model.adapter,
            trace_headers=trace_headers,
            images=spec.prompt.images,
            prompt_tokens=model.own_count(spec.prompt),
        )

    def _preparer(self, model: GeneratedModel, watch: GenerationWatch) -> Prepare:
        """How the model's requests are prepared: for its one server, or through its pool."""
        dispatcher = self._dispatcher
        if dispatcher is not None:
            pooled = dispatcher.preparer(
                model.base or model.name, self._backend, model.target, watch
            )
            if pooled is not None:
                return pooled
        return functools.partial(self._backend.prepare, model.target)


def _groups(plan: Plan) -> list[list[ChoiceSpec]]:
    """The choices each backend request answers: one each, or a beam search's of one prompt."""
    if plan.choices[0].params.beam is None:
        return [[spec] for spec in plan.choices]
    groups: dict[int, list[ChoiceSpec]] = {}
    for spec in plan.choices:
        groups.setdefault(spec.prompt_index, []).append(spec)
    return list(groups.values())


async def _prepare(
    prepare: Prepare, requests: Sequence[GenerationRequest], admission: PendingAdmission | None
) -> list[PreparedRequest]:
    """Every request prepared, nothing sent. Where one cannot be, the admission answers first,
    as it would have had the request gone: a refusal is the answer, and an admitted request's
    error carries its quota."""
    prepared: list[PreparedRequest] = []
    try:
        for request in requests:
            prepared.append(await prepare(request))
    except Exception:
        if admission is not None:
            await admission.admitted()
        raise
    return prepared


async def _admit(
    prepared: Sequence[PreparedRequest],
    admission: PendingAdmission | None,
    watch: GenerationWatch,
) -> None:
    """Await the admission: every request goes once it admits (or before it, where it is
    ``expected`` to), and none goes, or all are stopped, should it refuse or the caller leave."""
    if admission is None:
        return
    if admission.expected:
        for request in prepared:
            request.send()
    try:
        await admission.admitted()
    except BaseException:
        for request in prepared:
            request.discard()
        raise
    watch.sent()
