"""What shaping both endpoints' answers shares: the answer header, usage, and the streaming
skeleton (opening chunks per choice, deltas, endings, the usage chunk), which hands on the chunks
each event makes together, to be written at once."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

from msgspec import UNSET, UnsetType

from gateway.core.events import ChoiceEnd, ChoiceResult, Event, TextDelta
from gateway.core.plan import Plan
from gateway.ids import random_hex
from gateway.openai.protocol import PromptTokensDetails, Usage


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
