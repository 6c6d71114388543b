"""One choice's backend chunks made into events under the choice's deadline: stop sequences cut,
tokens counted, log probs lined up with the text; a beam search's answer made into its
choices."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import anyio

from adapters.contract import Beam, TokenChunk
from gateway.core.events import ChoiceEnd, Event, TextDelta, UsageMeter, finish_reason, token_texts
from gateway.core.plan import ChoiceSpec
from gateway.core.ports import ModelTokenizer
from gateway.core.stops import Cut, StopCutter, Token
from gateway.core.streams import CLEANUP_GRACE_S, timed_out
from gateway.errors import GatewayTimeoutError

logger = logging.getLogger(__name__)


async def close_quietly(chunks: AsyncIterator[TokenChunk]) -> None:
    """Close a backend stream (this cancels its Triton request), even inside a cancelled scope."""
    if not isinstance(chunks, AsyncGenerator):
        return
    with anyio.move_on_after(CLEANUP_GRACE_S, shield=True):
        try:
            await chunks.aclose()
        except Exception:
            logger.warning("closing a backend stream failed", exc_info=True)


class Choice:
    """One choice as its chunks arrive: ``feed`` each, then ``end``."""

    __slots__ = (
        "_cached",
        "_counted",
        "_meter",
        "_prompt_tokens",
        "_raw",
        "_tokenizer",
        "cutter",
        "logprobs",
        "spec",
    )

    def __init__(
        self, spec: ChoiceSpec, tokenizer: ModelTokenizer, *, logprobs: bool, meter: UsageMeter
    ) -> None:
        self.spec = spec
        self._tokenizer = tokenizer
        self.logprobs = logprobs
        self._meter = meter
        # Without stop sequences nor log probs the text goes out as it comes: nothing to cut,
        # no tokens to line up with it, so no cutter to ask at every chunk.
        self.cutter: StopCutter | None = (
            StopCutter(spec.params.stop, by_token=logprobs)
            if spec.params.stop or logprobs
            else None
        )
        self._raw: list[str] = []
        self._counted: int | None = 0
        self._prompt_tokens: int | None = None
        self._cached: int | None = None

    async def tokens(self, chunk: TokenChunk) -> list[Token]:
        """The tokens behind ``chunk``'s text, with their log probs."""
        return await _tokens(self._tokenizer, chunk.text, chunk.logprobs, True)

    def feed(self, chunk: TokenChunk, tokens: Sequence[Token] = ()) -> TextDelta | None:
        """The text of ``chunk`` that is shown (None: none yet); ``tokens`` (``tokens(chunk)``)
        where log probs were asked and the chunk has them."""
        spec = self.spec
        self._meter.generated(spec, chunk.token_count)
        self._raw.append(chunk.text)
        count = chunk.token_count
        self._counted = None if self._counted is None or count is None else self._counted + count
        self._prompt_tokens = chunk.prompt_tokens or self._prompt_tokens
        if self._cached is None:
            self._cached = chunk.cached_tokens
        cutter = self.cutter
        if cutter is None:
            return TextDelta(spec.index, chunk.text) if chunk.text else None
        cut = cutter.feed(chunk.text, tokens)
        return _delta(spec.index, cut) if cut.text or cut.tokens else None

    async def end(self) -> list[Event]:
        """The text held back, and the choice's ending."""
        spec, cutter = self.spec, self.cutter
        events: list[Event] = []
        stopped = False
        if cutter is not None:
            tail = cutter.flush()
            if tail.text or tail.tokens:
                events.append(_delta(spec.index, tail))
            stopped = cutter.stopped
        completion_tokens = self._counted
        if completion_tokens is None:
            # Re-tokenized text can come out longer than what the engine generated.
            counted_again = await self._tokenizer.count("".join(self._raw))
            completion_tokens = min(counted_again, spec.params.max_tokens)
        prompt_tokens = self._prompt_tokens or spec.prompt.token_count
        cached = self._cached
        end = ChoiceEnd(
            index=spec.index,
            prompt_index=spec.prompt_index,
            finish_reason=finish_reason(stopped, completion_tokens, spec.params.max_tokens),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=None if cached is None else min(cached, prompt_tokens),
        )
        self._meter.ended(end)
        events.append(end)
        return events


class Deadline:
    """The deadline of one choice's stream: one timer for the whole stream, not one per event.

    The reader sets ``waiting`` (and the task's ``cancelling`` count) while it awaits the
    stream: when the deadline passes then, the awaiting task is cancelled, and the reader turns
    the cancellation into the timeout (``raise_if_expired``, as ``asyncio.timeout`` does); when
    it passes while the consumer is busy elsewhere, ``expired`` says so at the next item.
    ``cancel`` once the stream ends.
    """

    __slots__ = ("cancelled", "cancelling", "expired", "handle", "timeout_s", "waiting")

    def __init__(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        self.timeout_s = timeout_s
        self.expired = False
        self.cancelled = False
        self.waiting: asyncio.Task[object] | None = None
        self.cancelling = 0
        self.handle = loop.call_at(loop.time() + timeout_s, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self.waiting is not None:
            self.cancelled = self.waiting.cancel()

    def raise_if_expired(self, task: asyncio.Task[object] | None) -> None:
        """Where the cancellation of ``task`` (waiting for the stream) was the deadline's, and
        nobody else's, the timeout is raised in its place."""
        if self.cancelled and task and task.uncancel() <= self.cancelling:
            raise self.error() from None

    def error(self) -> GatewayTimeoutError:
        """The timeout, as the client is told."""
        return timed_out(self.timeout_s)

    def cancel(self) -> None:
        """The stream ended: the timer goes."""
        self.handle.cancel()


class ChoiceReader:
    """A request's one choice read in the caller's task under the deadline: ``next`` returns
    its events one by one (``None`` after its end), with no generator of its own between the
    backend's stream and the core's."""

    __slots__ = ("_choice", "_chunks", "_deadline", "_ending", "_open")

    def __init__(self, choice: Choice, chunks: AsyncIterator[TokenChunk], timeout_s: float) -> None:
        self._choice = choice
        self._chunks = chunks
        self._deadline = Deadline(timeout_s)
        self._ending: list[Event] | None = None
        self._open = True

    async def next(self) -> Event | None:
        """The choice's next event: shown text, then what was held back and its ending."""
        ending = self._ending
        if ending is None:
            choice, chunks, deadline = self._choice, self._chunks, self._deadline
            cutter, logprobs = choice.cutter, choice.logprobs
            # Read here rather than through a coroutine of its own: one frame less a token.
            task = asyncio.current_task()
            while cutter is None or not cutter.stopped:
                deadline.waiting, deadline.cancelling = task, task.cancelling() if task else 0
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    self._open = False
                    break
                except asyncio.CancelledError:
                    deadline.raise_if_expired(task)
                    raise
                finally:
                    deadline.waiting = None
                if deadline.expired:
                    raise deadline.error()
                tokens = await choice.tokens(chunk) if logprobs and chunk.logprobs else ()
                delta = choice.feed(chunk, tokens)
                if delta is not None:
                    return delta
            await self.close()
            ending = self._ending = await choice.end()
        return ending.pop(0) if ending else None

    async def close(self) -> None:
        """Stop the timer and close the backend's stream (cancelling its request) if it is
        still open."""
        self._deadline.cancel()
        if self._open:
            self._open = False
            await close_quietly(self._chunks)


async def choice_events(choice: Choice, chunks: AsyncIterator[TokenChunk]) -> AsyncGenerator[Event]:
    """The events of one choice of several (each streamed in a task of its own), ending with
    its :class:`ChoiceEnd`; the backend stream is closed on every exit."""
    exhausted = False
    try:
        async for chunk in chunks:
            tokens = await choice.tokens(chunk) if choice.logprobs and chunk.logprobs else ()
            delta = choice.feed(chunk, tokens)
            if delta is not None:
                yield delta
            if choice.cutter is not None and choice.cutter.stopped:
                break
        else:
            exhausted = True
    finally:
        if not exhausted:
            await close_quietly(chunks)
    for event in await choice.end():
        yield event


async def beam_events(
    specs: Sequence[ChoiceSpec],
    chunks: AsyncIterator[TokenChunk],
    tokenizer: ModelTokenizer,
    *,
    logprobs: bool,
    meter: UsageMeter,
) -> AsyncGenerator[Event]:
    """The choices one beam search answers, its best beams first: each beam's text (stop
    sequences cut), its log probs where the entry returns them, and ending. Every beam's
    tokens are used, so the first choice's count also holds those of the beams beyond the
    ``n`` returned (TensorRT-LLM's count). The meter holds every beam's tokens as soon as
    the engine's answer arrives, so a request cancelled while its choices are being sent is
    charged them all."""
    final: TokenChunk | None = None
    first = specs[0]
    try:
        async for chunk in chunks:
            meter.generated(first, None)
            final = chunk
    finally:
        await close_quietly(chunks)
    beams = (final.beams or (Beam(final.text),)) if final is not None else ()
    max_tokens = first.params.max_tokens
    counts = [await _beam_tokens(tokenizer, beam, max_tokens) for beam in beams]
    hidden = sum(counts[len(specs) :])
    prompt_tokens = (final.prompt_tokens if final else None) or first.prompt.token_count
    cached = final.cached_tokens if final is not None else None
    answers: list[tuple[Cut, ChoiceEnd]] = []
    for position, spec in enumerate(specs):
        beam = beams[position] if position < len(beams) else Beam("")
        beam_logprobs = beam.logprobs if logprobs else ()
        cutter = StopCutter(spec.params.stop, by_token=bool(beam_logprobs))
        tokens = await _tokens(tokenizer, beam.text, beam_logprobs, logprobs)
        shown = cutter.feed(beam.text, tokens)
        shown += cutter.flush()
        count = counts[position] if position < len(counts) else 0
        end = ChoiceEnd(
            index=spec.index,
            prompt_index=spec.prompt_index,
            finish_reason=finish_reason(cutter.stopped, count, spec.params.max_tokens),
            prompt_tokens=prompt_tokens,
            completion_tokens=count + (hidden if position == 0 else 0),
            cached_tokens=None if cached is None else min(cached, prompt_tokens),
        )
        meter.ended(end)
        answers.append((shown, end))
    for shown, end in answers:
        if shown.text or shown.tokens:
            yield _delta(end.index, shown)
        yield end


async def _beam_tokens(tokenizer: ModelTokenizer, beam: Beam, max_tokens: int) -> int:
    """A beam's tokens: the engine's count, else its text re-tokenized (within the budget)."""
    if beam.token_count is not None:
        return beam.token_count
    return min(await tokenizer.count(beam.text), max_tokens)


async def _tokens(
    tokenizer: ModelTokenizer, text: str, logprobs: Sequence[float], asked: bool
) -> list[Token]:
    """The tokens behind ``text``, with their log probs (none when they are not ``asked``)."""
    if not asked or not logprobs:
        return []
    count = len(logprobs)
    pieces = await tokenizer.pieces(text) if count > 1 else None
    return list(zip(token_texts(text, count, pieces), logprobs, strict=True))


def _delta(index: int, cut: Cut) -> TextDelta:
    return TextDelta(index, cut.text, cut.logprobs, cut.tokens)
