"""Text completion answers, whole and streamed, from the neutral generation events."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from gateway.core.events import ChoiceEnd, ChoiceResult, Event, TextDelta
from gateway.core.plan import Plan
from gateway.openai.protocol import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
)
from gateway.openai.shaping import Header, StreamUsage, finished, stream_shape, usage_of


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
