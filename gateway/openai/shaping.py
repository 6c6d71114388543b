"""The answers of both completion endpoints, whole and streamed, from the neutral generation
events: what they share (the answer header, usage, and the streaming skeleton: opening chunks per
choice, deltas, endings, the usage chunk, handing on the chunks each event makes together, to be
written at once), then chat's answers (tool calls and reasoning included), then text
completion's."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from gateway.core.events import ChoiceEnd, ChoiceResult, Event, TextDelta
from gateway.core.plan import Plan
from gateway.ids import random_hex
from gateway.openai.chat.calls import DeltaShaper, message_parts, whole_message
from gateway.openai.chat.calls import finish_reason as tool_finish
from gateway.openai.chat.plan import output_of
from gateway.openai.protocol import (
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
    CompletionTokensDetails,
    PromptTokensDetails,
    TokenLogprob,
    Usage,
)
from gateway.tools.output import OutputRules


@dataclass(frozen=True, slots=True)
class Header:
    """What every object of one answer repeats."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> Header:
        """A fresh id (``chatcmpl-...``, ``cmpl-...``) stamped now."""
        return cls(id=f"{prefix}-{random_hex(16)}", created=int(time.time()), model=model)


def usage_of(ends: Iterable[ChoiceEnd]) -> Usage:
    """Usage of a request: each prompt counted once (its cached tokens too, as its first
    ending choice reports them), every choice's completion added up."""
    prompts: dict[int, int] = {}
    cached: dict[int, int | None] = {}
    completion = 0
    for end in ends:
        prompts.setdefault(end.prompt_index, end.prompt_tokens)
        cached.setdefault(end.prompt_index, end.cached_tokens)
        completion += end.completion_tokens
    prompt = sum(prompts.values())
    reported = [tokens for tokens in cached.values() if tokens is not None]
    details = PromptTokensDetails(cached_tokens=sum(reported)) if reported else UNSET
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=details,
    )


def finished(results: list[ChoiceResult]) -> list[ChoiceEnd]:
    ends = [result.end for result in results]
    if any(end is None for end in ends):
        raise RuntimeError("a choice ended without its final event")
    return [end for end in ends if end is not None]


ChunkT = TypeVar("ChunkT")

ChoiceT = TypeVar("ChoiceT")

StreamUsage = Usage | UnsetType | None


async def stream_shape(
    plan: Plan,
    events: AsyncGenerator[Event, None],
    *,
    wrap: Callable[[list[ChoiceT], StreamUsage], ChunkT],
    on_start: Callable[[int], Iterable[ChoiceT]],
    on_delta: Callable[[TextDelta], Iterable[ChoiceT]],
    on_end: Callable[[ChoiceEnd], Iterable[ChoiceT]],
) -> AsyncGenerator[list[ChunkT], None]:
    """The skeleton both streams share: opening chunks per choice, deltas, endings, usage.

    The chunks one event makes come as one list (a chat choice's role chunk with its first
    text, an ending with the text a parser held back), so the stream writes them at once
    instead of one write and one turn of the event loop each.
    """
    usage: StreamUsage = None if plan.include_usage else UNSET
    started: set[int] = set()
    ends: list[ChoiceEnd] = []
    async with aclosing(events):
        async for event in events:
            batch: list[ChunkT] = []
            if event.index not in started:
                started.add(event.index)
                batch.extend(wrap([choice], usage) for choice in on_start(event.index))
            if isinstance(event, ChoiceEnd):
                ends.append(event)
                shaped = on_end(event)
            else:
                shaped = on_delta(event)
            batch.extend(wrap([choice], usage) for choice in shaped)
            if batch:
                yield batch
    if plan.include_usage:
        yield [wrap([], usage_of(ends))]


def chat_logprobs(tokens: Iterable[str], logprobs: Iterable[float]) -> ChatLogprobs:
    """Chat ``logprobs.content`` for sampled tokens (no alternatives)."""
    return ChatLogprobs(
        content=[
            TokenLogprob(token=token, logprob=lp, bytes=list(token.encode()), top_logprobs=[])
            for token, lp in zip(tokens, logprobs, strict=True)
        ]
    )


def chat_completion(plan: Plan, results: list[ChoiceResult], header: Header) -> ChatCompletion:
    """A non-streaming chat answer."""
    ends = finished(results)
    output = output_of(plan)
    choices = []
    reasonings: list[str] = []
    for result, end in zip(results, ends, strict=True):
        message = AssistantMessage(content=result.text)
        reason: str = end.finish_reason
        if output.parses:
            folded = whole_message(output, result.text)
            content, calls = message_parts(folded)
            if folded.reasoning is not None and not (content or "").strip():
                # An answer cut off while the model still reasoned has no content yet.
                content = None
            message = AssistantMessage(
                content=content,
                reasoning_content=folded.reasoning if output.reasoning else UNSET,
                reasoning=folded.reasoning if output.reasoning else UNSET,
                tool_calls=calls or UNSET,
            )
            reasonings.append(folded.reasoning or "")
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
        usage=with_reasoning(usage_of(ends), output, reasonings),
    )


def with_reasoning(usage: Usage, output: OutputRules, reasonings: list[str]) -> Usage:
    """``usage`` with ``completion_tokens_details.reasoning_tokens``, for a model that reasons:
    the tokens of its reasoning text, as the model's tokenizer counts them."""
    if output.reasoning is None or output.count_tokens is None:
        return usage
    count = output.count_tokens
    tokens = sum(count(text) for text in reasonings if text)
    details = CompletionTokensDetails(reasoning_tokens=min(tokens, usage.completion_tokens))
    return msgspec.structs.replace(usage, completion_tokens_details=details)


def chat_chunks(
    plan: Plan, events: AsyncGenerator[Event, None], header: Header
) -> AsyncGenerator[list[ChatCompletionChunk], None]:
    """Streamed chat: a role chunk per choice, content deltas, a finish chunk, then usage."""

    def wrap(choices: list[ChatChunkChoice], usage: StreamUsage) -> ChatCompletionChunk:
        if isinstance(usage, Usage):
            reasonings = [shaper.reasoning for shaper in shapers.values()]
            usage = with_reasoning(usage, output, reasonings)
        return ChatCompletionChunk(
            id=header.id, created=header.created, model=header.model, choices=choices, usage=usage
        )

    shapers: dict[int, DeltaShaper] = {}
    output = output_of(plan)

    def on_start(index: int) -> list[ChatChunkChoice]:
        if output.parses:
            shapers[index] = DeltaShaper(output)
        return [ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))]

    def on_delta(event: TextDelta) -> list[ChatChunkChoice]:
        logprobs = chat_logprobs(event.tokens, event.logprobs) if plan.logprobs else None
        shaper = shapers.get(event.index)
        if shaper is None:
            return [
                ChatChunkChoice(
                    index=event.index, delta=ChatDelta(content=event.text), logprobs=logprobs
                )
            ]
        deltas = shaper.deltas(event.text)
        if not deltas and logprobs is not None:
            deltas = [ChatDelta()]
        # The tokens' log probabilities ride on the first of the chunks they made.
        return [
            ChatChunkChoice(index=event.index, delta=delta, logprobs=logprobs if not i else None)
            for i, delta in enumerate(deltas)
        ]

    def on_end(event: ChoiceEnd) -> list[ChatChunkChoice]:
        shaper = shapers.get(event.index)
        reason: str = event.finish_reason
        chunks: list[ChatChunkChoice] = []
        if shaper is not None:
            chunks.extend(ChatChunkChoice(index=event.index, delta=d) for d in shaper.end())
            reason = tool_finish(reason, shaper.calls)
        chunks.append(ChatChunkChoice(index=event.index, delta=ChatDelta(), finish_reason=reason))
        return chunks

    return stream_shape(
        plan, events, wrap=wrap, on_start=on_start, on_delta=on_delta, on_end=on_end
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


def text_completion(plan: Plan, results: list[ChoiceResult], header: Header) -> Completion:
    """A non-streaming text completion answer; ``echo`` puts the prompt first."""
    ends = finished(results)
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


def completion_chunks(
    plan: Plan, events: AsyncGenerator[Event, None], header: Header
) -> AsyncGenerator[list[Completion], None]:
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

    return stream_shape(
        plan, events, wrap=wrap, on_start=on_start, on_delta=on_delta, on_end=on_end
    )
