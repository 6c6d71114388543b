"""Chat answers, whole and streamed (tool calls included), from the neutral generation events."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable

import msgspec
from msgspec import UNSET

from gateway.core.events import ChoiceEnd, ChoiceResult, Event, TextDelta
from gateway.core.plan import Plan
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
    CompletionTokensDetails,
    TokenLogprob,
    Usage,
)
from gateway.openai.shaping import Header, StreamUsage, finished, stream_shape, usage_of
from gateway.tools.output import OutputRules


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

    return stream_shape(
        plan, events, wrap=wrap, on_start=on_start, on_delta=on_delta, on_end=on_end
    )
