"""Neutral generation events and results shaped into OpenAI's response and chunk objects."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

from msgspec import UNSET, UnsetType

from gateway.generation import ChoiceEnd, ChoiceResult, Event, TextDelta
from gateway.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    TokenLogprob,
    Usage,
)
from gateway.tools.shape import DeltaShaper, whole_message
from gateway.tools.shape import finish_reason as tool_finish
from gateway.translate import Plan


@dataclass(frozen=True, slots=True)
class Header:
    """What every object of one answer repeats."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> Header:
        """A fresh id (``chatcmpl-...``, ``cmpl-...``) stamped now."""
        return cls(id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time()), model=model)


def usage_of(ends: Iterable[ChoiceEnd]) -> Usage:
    """Usage of a request: each prompt counted once, every choice's completion added up."""
    prompts: dict[int, int] = {}
    completion = 0
    for end in ends:
        prompts.setdefault(end.prompt_index, end.prompt_tokens)
        completion += end.completion_tokens
    prompt = sum(prompts.values())
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def chat_logprobs(tokens: Iterable[str], logprobs: Iterable[float]) -> ChatLogprobs:
    """Chat ``logprobs.content`` for sampled tokens (no alternatives)."""
    return ChatLogprobs(
        content=[
            TokenLogprob(token=token, logprob=lp, bytes=list(token.encode()), top_logprobs=[])
            for token, lp in zip(tokens, logprobs, strict=True)
        ]
    )


def completion_logprobs(tokens: list[str], logprobs: list[float], start: int) -> CompletionLogprobs:
    """Legacy ``logprobs`` of a text completion; offsets count from ``start``."""
    offsets = []
    for token in tokens:
        offsets.append(start)
        start += len(token)
    return CompletionLogprobs(
        tokens=tokens, token_logprobs=logprobs, top_logprobs=None, text_offset=offsets
    )


def _finished(results: list[ChoiceResult]) -> list[ChoiceEnd]:
    ends = [result.end for result in results]
    if any(end is None for end in ends):
        raise RuntimeError("a choice ended without its final event")
    return [end for end in ends if end is not None]


def chat_completion(plan: Plan, results: list[ChoiceResult], header: Header) -> ChatCompletion:
    """A non-streaming chat answer."""
    ends = _finished(results)
    choices = []
    for result, end in zip(results, ends, strict=True):
        message = AssistantMessage(content=result.text)
        reason: str = end.finish_reason
        if plan.output.parses_calls:
            content, calls = whole_message(plan.output, result.text)
            message = AssistantMessage(content=content, tool_calls=calls or UNSET)
            reason = tool_finish(reason, len(calls))
        choices.append(
            ChatChoice(
                index=result.index,
                message=message,
                logprobs=chat_logprobs(result.tokens, result.logprobs) if plan.logprobs else None,
                finish_reason=reason,
            )
        )
    return ChatCompletion(
        id=header.id,
        created=header.created,
        model=header.model,
        choices=choices,
        usage=usage_of(ends),
    )


def text_completion(plan: Plan, results: list[ChoiceResult], header: Header) -> Completion:
    """A non-streaming text completion answer; ``echo`` puts the prompt first."""
    ends = _finished(results)
    choices = []
    for result, end in zip(results, ends, strict=True):
        prefix = plan.choices[result.index].prompt.echoed if plan.echo else ""
        logprobs = (
            completion_logprobs(result.tokens, result.logprobs, len(prefix))
            if plan.logprobs
            else None
        )
        choices.append(
            CompletionChoice(
                index=result.index,
                text=prefix + result.text,
                logprobs=logprobs,
                finish_reason=end.finish_reason,
            )
        )
    return Completion(
        id=header.id,
        created=header.created,
        model=header.model,
        choices=choices,
        usage=usage_of(ends),
    )


ChunkT = TypeVar("ChunkT")
ChoiceT = TypeVar("ChoiceT")
StreamUsage = Usage | UnsetType | None


async def _stream_shape(
    plan: Plan,
    events: AsyncGenerator[Event, None],
    *,
    wrap: Callable[[list[ChoiceT], StreamUsage], ChunkT],
    on_start: Callable[[int], Iterable[ChoiceT]],
    on_delta: Callable[[TextDelta], Iterable[ChoiceT]],
    on_end: Callable[[ChoiceEnd], Iterable[ChoiceT]],
) -> AsyncGenerator[ChunkT, None]:
    """The skeleton both streams share: opening chunks per choice, deltas, endings, usage."""
    usage: StreamUsage = None if plan.include_usage else UNSET
    started: set[int] = set()
    ends: list[ChoiceEnd] = []
    async with aclosing(events):
        async for event in events:
            if event.index not in started:
                started.add(event.index)
                for choice in on_start(event.index):
                    yield wrap([choice], usage)
            if isinstance(event, ChoiceEnd):
                ends.append(event)
                shaped = on_end(event)
            else:
                shaped = on_delta(event)
            for choice in shaped:
                yield wrap([choice], usage)
    if plan.include_usage:
        yield wrap([], usage_of(ends))


def chat_chunks(
    plan: Plan, events: AsyncGenerator[Event, None], header: Header
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """Streamed chat: a role chunk per choice, content deltas, a finish chunk, then usage."""

    def wrap(choices: list[ChatChunkChoice], usage: StreamUsage) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=header.id, created=header.created, model=header.model, choices=choices, usage=usage
        )

    shapers: dict[int, DeltaShaper] = {}

    def on_start(index: int) -> list[ChatChunkChoice]:
        if plan.output.parses_calls:
            shapers[index] = DeltaShaper(plan.output)
        return [ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))]

    def on_delta(event: TextDelta) -> list[ChatChunkChoice]:
        logprobs = chat_logprobs(event.tokens, event.logprobs) if plan.logprobs else None
        shaper = shapers.get(event.index)
        delta = ChatDelta(content=event.text) if shaper is None else shaper.delta(event.text)
        if delta is None and logprobs is None:
            return []
        return [ChatChunkChoice(index=event.index, delta=delta or ChatDelta(), logprobs=logprobs)]

    def on_end(event: ChoiceEnd) -> list[ChatChunkChoice]:
        shaper = shapers.get(event.index)
        reason: str = event.finish_reason
        chunks = []
        if shaper is not None:
            held = shaper.end()
            if held is not None:
                chunks.append(ChatChunkChoice(index=event.index, delta=held))
            reason = tool_finish(reason, shaper.calls)
        chunks.append(ChatChunkChoice(index=event.index, delta=ChatDelta(), finish_reason=reason))
        return chunks

    return _stream_shape(
        plan, events, wrap=wrap, on_start=on_start, on_delta=on_delta, on_end=on_end
    )


def completion_chunks(
    plan: Plan, events: AsyncGenerator[Event, None], header: Header
) -> AsyncGenerator[Completion, None]:
    """Streamed text completion: the echoed prompt, text deltas, a finish chunk, then usage."""
    offsets: dict[int, int] = {}

    def wrap(choices: list[CompletionChoice], usage: StreamUsage) -> Completion:
        return Completion(
            id=header.id, created=header.created, model=header.model, choices=choices, usage=usage
        )

    def on_start(index: int) -> list[CompletionChoice]:
        prompt = plan.choices[index].prompt.echoed if plan.echo else ""
        offsets[index] = len(prompt)
        return [CompletionChoice(index=index, text=prompt)] if prompt else []

    def on_delta(event: TextDelta) -> list[CompletionChoice]:
        start = offsets[event.index]
        offsets[event.index] = start + len(event.text)
        logprobs = (
            completion_logprobs(list(event.tokens), list(event.logprobs), start)
            if plan.logprobs
            else None
        )
        return [CompletionChoice(index=event.index, text=event.text, logprobs=logprobs)]

    def on_end(event: ChoiceEnd) -> list[CompletionChoice]:
        return [CompletionChoice(index=event.index, text="", finish_reason=event.finish_reason)]

    return _stream_shape(
        plan, events, wrap=wrap, on_start=on_start, on_delta=on_delta, on_end=on_end
    )
