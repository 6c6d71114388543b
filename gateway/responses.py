"""Neutral generation events and results shaped into OpenAI's response and chunk objects."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Iterable
from contextlib import aclosing
from dataclasses import dataclass, field

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
    return ChatCompletion(
        id=header.id,
        created=header.created,
        model=header.model,
        choices=[
            ChatChoice(
                index=result.index,
                message=AssistantMessage(content=result.text),
                logprobs=chat_logprobs(result.tokens, result.logprobs) if plan.logprobs else None,
                finish_reason=end.finish_reason,
            )
            for result, end in zip(results, ends, strict=True)
        ],
        usage=usage_of(ends),
    )


def text_completion(plan: Plan, results: list[ChoiceResult], header: Header) -> Completion:
    """A non-streaming text completion answer; ``echo`` puts the prompt first."""
    ends = _finished(results)
    choices = []
    for result, end in zip(results, ends, strict=True):
        prefix = plan.choices[result.index].prompt.text if plan.echo else ""
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


@dataclass(slots=True)
class _StreamState:
    started: set[int] = field(default_factory=set)
    ends: list[ChoiceEnd] = field(default_factory=list)
    offsets: dict[int, int] = field(default_factory=dict)


async def chat_chunks(
    plan: Plan, events: AsyncGenerator[Event, None], header: Header
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """Streamed chat: a role chunk per choice, content deltas, a finish chunk, then usage."""
    usage: UnsetType | None = None if plan.include_usage else UNSET
    state = _StreamState()

    def chunk(choice: ChatChunkChoice) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=header.id, created=header.created, model=header.model, choices=[choice], usage=usage
        )

    async with aclosing(events):
        async for event in events:
            if event.index not in state.started:
                state.started.add(event.index)
                role = ChatDelta(role="assistant", content="")
                yield chunk(ChatChunkChoice(index=event.index, delta=role))
            if isinstance(event, ChoiceEnd):
                state.ends.append(event)
                finish = event.finish_reason
                yield chunk(
                    ChatChunkChoice(index=event.index, delta=ChatDelta(), finish_reason=finish)
                )
                continue
            logprobs = chat_logprobs(event.tokens, event.logprobs) if plan.logprobs else None
            delta = ChatDelta(content=event.text)
            yield chunk(ChatChunkChoice(index=event.index, delta=delta, logprobs=logprobs))
    if plan.include_usage:
        yield ChatCompletionChunk(
            id=header.id,
            created=header.created,
            model=header.model,
            choices=[],
            usage=usage_of(state.ends),
        )


async def completion_chunks(
    plan: Plan, events: AsyncGenerator[Event, None], header: Header
) -> AsyncGenerator[Completion, None]:
    """Streamed text completion: the echoed prompt, text deltas, a finish chunk, then usage."""
    usage: UnsetType | None = None if plan.include_usage else UNSET
    state = _StreamState()

    def chunk(choice: CompletionChoice) -> Completion:
        return Completion(
            id=header.id, created=header.created, model=header.model, choices=[choice], usage=usage
        )

    async with aclosing(events):
        async for event in events:
            if event.index not in state.started:
                state.started.add(event.index)
                prompt = plan.choices[event.index].prompt.text if plan.echo else ""
                state.offsets[event.index] = len(prompt)
                if prompt:
                    yield chunk(CompletionChoice(index=event.index, text=prompt))
            if isinstance(event, ChoiceEnd):
                state.ends.append(event)
                finish = event.finish_reason
                yield chunk(CompletionChoice(index=event.index, text="", finish_reason=finish))
                continue
            yield chunk(_completion_delta(plan, event, state))
    if plan.include_usage:
        yield Completion(
            id=header.id,
            created=header.created,
            model=header.model,
            choices=[],
            usage=usage_of(state.ends),
        )


def _completion_delta(plan: Plan, event: TextDelta, state: _StreamState) -> CompletionChoice:
    start = state.offsets[event.index]
    state.offsets[event.index] = start + len(event.text)
    logprobs = (
        completion_logprobs(list(event.tokens), list(event.logprobs), start)
        if plan.logprobs
        else None
    )
    return CompletionChoice(index=event.index, text=event.text, logprobs=logprobs)
