"""Run a plan's choices against the backend and stream neutral events: text deltas and endings."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Literal

import anyio

from adapters.contract import Backend, Beam, GenerationRequest, TokenChunk
from gateway.catalog.registry import ServedModel
from gateway.core.plan import ChoiceSpec, Plan
from gateway.core.stops import Cut, StopCutter, Token
from gateway.core.streams import CLEANUP_GRACE_S, merge, single
from gateway.ids import random_hex
from gateway.observability import GenerationWatch, Observability, ObservabilitySettings
from gateway.replicas.router import Router

logger = logging.getLogger(__name__)
FinishReason = Literal["stop", "length"]
Opener = Callable[[GenerationRequest], AsyncIterator[TokenChunk]]
"""Starts one backend request: straight to the model's Triton, or through its replica pool."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New text of one choice, with the log probabilities of the tokens behind it."""

    index: int
    text: str
    logprobs: tuple[float, ...] = ()
    tokens: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ChoiceEnd:
    """One choice finished; its token counts. ``cached_tokens`` is how much of the prompt the
    engine found in its KV cache (None where the deployment does not say)."""

    index: int
    prompt_index: int
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None


Event = TextDelta | ChoiceEnd


@dataclass(slots=True)
class ChoiceResult:
    """A whole choice, folded from its events."""

    index: int
    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    end: ChoiceEnd | None = None


@dataclass(slots=True)
class UsageMeter:
    """Tokens a request used so far: each prompt once the engine took it, every choice's output.

    A choice's count is exact once it ended; before that (a cancelled or failed request) it is
    what the engine reported so far.
    """

    prompts: dict[int, int] = field(default_factory=dict)
    choices: dict[int, int] = field(default_factory=dict)

    def generated(self, spec: ChoiceSpec, tokens: int | None) -> None:
        """A chunk of ``spec`` arrived, holding ``tokens`` tokens (None: not reported)."""
        self.prompts.setdefault(spec.prompt_index, spec.prompt.token_count)
        if tokens:
            self.choices[spec.index] = self.choices.get(spec.index, 0) + tokens

    def ended(self, end: ChoiceEnd) -> None:
        """A choice finished with these counts."""
        self.prompts[end.prompt_index] = end.prompt_tokens
        self.choices[end.index] = end.completion_tokens

    def total(self) -> int:
        """Prompt plus completion tokens used so far."""
        return sum(self.prompts.values()) + sum(self.choices.values())


def token_texts(text: str, count: int, pieces: Sequence[str] | None) -> tuple[str, ...]:
    """Texts of ``count`` tokens that produced ``text``; re-tokenized pieces when they line up
    (as many, spelling ``text``), so that the tokens always spell the text."""
    if count == 1:
        return (text,)
    if pieces is not None and len(pieces) == count and "".join(pieces) == text:
        return tuple(pieces)
    return (text, *([""] * (count - 1))) if count else ()


def _add(total: int | None, count: int | None) -> int | None:
    """Running token count; ``None`` once a chunk comes without one."""
    return None if total is None or count is None else total + count


def finish_reason(stopped: bool, completion_tokens: int, max_tokens: int) -> FinishReason:
    """``length`` when the completion used its whole budget without meeting a stop."""
    return "length" if not stopped and completion_tokens >= max_tokens else "stop"


async def close_quietly(chunks: AsyncIterator[TokenChunk]) -> None:
    """Close a backend stream (this cancels its Triton request), even inside a cancelled scope."""
    if not isinstance(chunks, AsyncGenerator):
        return
    with anyio.move_on_after(CLEANUP_GRACE_S, shield=True):
        try:
            await chunks.aclose()
        except Exception:
            logger.warning("closing a backend stream failed", exc_info=True)


class ChoiceRunner:
    """Streams one choice: stop sequences cut, counts kept, the backend closed on every exit."""

    def __init__(
        self, open_stream: Opener, model: ServedModel, *, logprobs: bool, meter: UsageMeter
    ) -> None:
        self._open = open_stream
        self._model = model
        self._logprobs = logprobs
        self._meter = meter

    async def run(
        self, spec: ChoiceSpec, request: GenerationRequest
    ) -> AsyncGenerator[Event, None]:
        """Events of one choice, ending with its :class:`ChoiceEnd`."""
        cutter = StopCutter(spec.params.stop, by_token=self._logprobs)
        raw: list[str] = []
        counted: int | None = 0
        prompt_tokens: int | None = None
        cached: int | None = None
        chunks = self._open(request)
        exhausted = False
        try:
            async for chunk in chunks:
                self._meter.generated(spec, chunk.token_count)
                raw.append(chunk.text)
                counted = _add(counted, chunk.token_count)
                prompt_tokens = chunk.prompt_tokens or prompt_tokens
                cached = chunk.cached_tokens if cached is None else cached
                cut = cutter.feed(chunk.text, await self._tokens(chunk.text, chunk.logprobs))
                if cut.text or cut.tokens:
                    yield _delta(spec.index, cut)
                if cutter.stopped:
                    break
            else:
                exhausted = True
        finally:
            if not exhausted:
                await close_quietly(chunks)
        tail = cutter.flush()
        if tail.text or tail.tokens:
            yield _delta(spec.index, tail)
        completion_tokens = counted
        if completion_tokens is None:
            # Re-tokenized text can come out longer than what the engine generated.
            counted_again = await self._model.tokenizer.count("".join(raw))
            completion_tokens = min(counted_again, spec.params.max_tokens)
        prompt_tokens = prompt_tokens or spec.prompt.token_count
        end = ChoiceEnd(
            index=spec.index,
            prompt_index=spec.prompt_index,
            finish_reason=finish_reason(cutter.stopped, completion_tokens, spec.params.max_tokens),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=None if cached is None else min(cached, prompt_tokens),
        )
        self._meter.ended(end)
        yield end

    async def run_beams(
        self, specs: Sequence[ChoiceSpec], request: GenerationRequest
    ) -> AsyncGenerator[Event, None]:
        """The choices one beam search answers, its best beams first: each beam's text (stop
        sequences cut), its log probs where the entry returns them, and ending. Every beam's
        tokens are used, so the first choice's count also holds those of the beams beyond the
        ``n`` returned (TensorRT-LLM's count). The meter holds every beam's tokens as soon as
        the engine's answer arrives, so a request cancelled while its choices are being sent is
        charged them all."""
        chunks = self._open(request)
        final: TokenChunk | None = None
        first = specs[0]
        try:
            async for chunk in chunks:
                self._meter.generated(first, None)
                final = chunk
        finally:
            await close_quietly(chunks)
        beams = (final.beams or (Beam(final.text),)) if final is not None else ()
        counts = [await self._beam_tokens(beam, first.params.max_tokens) for beam in beams]
        hidden = sum(counts[len(specs) :])
        prompt_tokens = (final.prompt_tokens if final else None) or first.prompt.token_count
        cached = final.cached_tokens if final is not None else None
        answers: list[tuple[Cut, ChoiceEnd]] = []
        for position, spec in enumerate(specs):
            beam = beams[position] if position < len(beams) else Beam("")
            logprobs = beam.logprobs if self._logprobs else ()
            cutter = StopCutter(spec.params.stop, by_token=bool(logprobs))
            shown = cutter.feed(beam.text, await self._tokens(beam.text, logprobs))
            shown += cutter.flush()
            tokens = counts[position] if position < len(counts) else 0
            end = ChoiceEnd(
                index=spec.index,
                prompt_index=spec.prompt_index,
                finish_reason=finish_reason(cutter.stopped, tokens, spec.params.max_tokens),
                prompt_tokens=prompt_tokens,
                completion_tokens=tokens + (hidden if position == 0 else 0),
                cached_tokens=None if cached is None else min(cached, prompt_tokens),
            )
            self._meter.ended(end)
            answers.append((shown, end))
        for shown, end in answers:
            if shown.text or shown.tokens:
                yield _delta(end.index, shown)
            yield end

    async def _beam_tokens(self, beam: Beam, max_tokens: int) -> int:
        """A beam's tokens: the engine's count, else its text re-tokenized (within the budget)."""
        if beam.token_count is not None:
            return beam.token_count
        return min(await self._model.tokenizer.count(beam.text), max_tokens)

    async def _tokens(self, text: str, logprobs: Sequence[float]) -> list[Token]:
        """The tokens behind ``text``, with their log probs (none when they are not asked)."""
        if not self._logprobs or not logprobs:
            return []
        count = len(logprobs)
        pieces = await self._model.tokenizer.pieces(text) if count > 1 else None
        return list(zip(token_texts(text, count, pieces), logprobs, strict=True))


def _delta(index: int, cut: Cut) -> TextDelta:
    return TextDelta(index, cut.text, cut.logprobs, cut.tokens)


class GenerationService:
    """Turns a plan into one merged event stream over the backend."""

    def __init__(
        self,
        backend: Backend,
        *,
        timeout_s: float,
        observability: Observability | None = None,
        router: Router | None = None,
    ) -> None:
        self._backend = backend
        self._timeout_s = timeout_s
        self._observability = observability or Observability(ObservabilitySettings())
        self._router = router

    def events(
        self,
        model: ServedModel,
        plan: Plan,
        meter: UsageMeter | None = None,
        *,
        priority: int = 0,
        cache_salt: int | None = None,
        admitted: Callable[[], Awaitable[None]] | None = None,
        send_ahead: bool = False,
    ) -> AsyncGenerator[Event, None]:
        """Every choice's events, interleaved as they arrive; closing it cancels the requests.

        ``meter`` counts the tokens used as they are generated; ``priority`` is the Triton
        request priority (0: the model's default); ``cache_salt`` the salt of the caller's
        KV-cache scope (``GenerationRequest.cache_salt``); ``admitted`` is awaited by each backend
        request before it is sent, or with ``send_ahead`` (an admission expected to admit) just
        after (``GenerationRequest.admitted``); no event comes before it is answered.
        """
        return self._observed(
            model, plan, meter or UsageMeter(), (priority, cache_salt), admitted, send_ahead
        )

    def _opener(self, model: ServedModel, watch: GenerationWatch) -> Opener:
        """How the model's requests reach Triton: its one server, or a replica of its pool."""
        router = self._router
        base = model.base or model.name
        backend, target = self._backend, model.target
        if router is not None:
            pool = router.pool(base)
            if pool is not None:
                return lambda request: router.stream(pool, backend, request, watch)
            direct = router.direct(base, backend, target)
            if direct is not None:
                return direct
        return lambda request: backend.generate(target, request)

    async def _observed(
        self,
        model: ServedModel,
        plan: Plan,
        meter: UsageMeter,
        placement: tuple[int, int | None],
        admitted: Callable[[], Awaitable[None]] | None,
        send_ahead: bool,
    ) -> AsyncGenerator[Event, None]:
        # Everything starts at the first iteration, so an unconsumed generator leaves no span.
        request_id = random_hex(16)
        priority, cache_salt = placement
        watch = self._observability.generation(
            {
                "gen_ai.request.model": model.name,
                "gen_ai.request.max_tokens": plan.choices[0].params.max_tokens,
                "gen_ai.request.choice.count": len(plan.choices),
                "triton.model": model.target.triton_model,
                "triton.request_id": request_id,
            },
            sent=admitted is None,
        )
        error: BaseException | None = None
        unfinished = {spec.index for spec in plan.choices}
        tokens = model.tokenizer if model.target.kind == "tensorrt_llm" else None
        runner = ChoiceRunner(
            self._opener(model, watch), model, logprobs=plan.logprobs, meter=meter
        )
        gate: Callable[[], Awaitable[None]] | None = None
        if admitted is not None:
            admission = admitted

            async def admitted_then_sent() -> None:
                await admission()
                watch.sent()

            gate = admitted_then_sent

        try:
            trace_headers = watch.trace_headers()

            def request_of(spec: ChoiceSpec) -> GenerationRequest:
                return GenerationRequest(
                    request_id=f"{request_id}-{spec.index}",
                    prompt=spec.prompt.text,
                    prompt_ids=spec.prompt.ids,
                    tokens=tokens,
                    params=spec.params,
                    stream=plan.stream,
                    timeout_s=self._timeout_s,
                    priority=priority,
                    cache_salt=cache_salt,
                    lora=model.adapter,
                    trace_headers=trace_headers,
                    images=spec.prompt.images,
                    prompt_tokens=model.own_count(spec.prompt),
                    admitted=gate,
                    send_ahead=send_ahead and gate is not None,
                )

            if plan.choices[0].params.beam is not None:
                groups: dict[int, list[ChoiceSpec]] = {}
                for spec in plan.choices:
                    groups.setdefault(spec.prompt_index, []).append(spec)
                streams = [
                    runner.run_beams(specs, request_of(specs[0])) for specs in groups.values()
                ]
            else:
                streams = [runner.run(spec, request_of(spec)) for spec in plan.choices]
            merged = single(streams[0], self._timeout_s) if len(streams) == 1 else None
            async with aclosing(merged or merge(streams, self._timeout_s)) as events:
                waiting = gate
                async for event in events:
                    if isinstance(event, ChoiceEnd):
                        unfinished.discard(event.index)
                    if waiting is not None:
                        # Answered already (the backend waited for it before sending, or before
                        # reading what it sent ahead): nothing is passed on for a request that
                        # was not admitted, whatever the backend.
                        await waiting()
                        waiting = None
                    if isinstance(event, ChoiceEnd):
                        watch.ended(
                            event.prompt_index,
                            event.prompt_tokens,
                            event.completion_tokens,
                            event.cached_tokens or 0,
                        )
                    elif event.text:
                        watch.text(event.index)
                    yield event
        except BaseException as exc:
            error = exc
            raise
        finally:
            # What reached the client, or was generated, counts however the call ended.
            cut = sum(meter.choices.get(index, 0) for index in unfinished)
            watch.cut_short(meter.prompts, cut)
            watch.close(error)

    async def collect(self, model: ServedModel, plan: Plan) -> list[ChoiceResult]:
        """Run a plan to the end and fold each choice's events."""
        return await fold(plan, self.events(model, plan))


async def fold(plan: Plan, events: AsyncGenerator[Event, None]) -> list[ChoiceResult]:
    """Each choice of a plan, whole, from its events."""
    results = {spec.index: ChoiceResult(spec.index) for spec in plan.choices}
    async with aclosing(events):
        async for event in events:
            result = results[event.index]
            if isinstance(event, ChoiceEnd):
                result.end = event
                continue
            result.text += event.text
            result.logprobs.extend(event.logprobs)
            result.tokens.extend(event.tokens)
    return [results[index] for index in sorted(results)]
