"""What a plan's generation streams: text deltas and endings of choices, the tokens they used,
and each choice folded whole from them."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Literal

from gateway.core.plan import ChoiceSpec, Plan

FinishReason = Literal["stop", "length"]


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


def finish_reason(stopped: bool, completion_tokens: int, max_tokens: int) -> FinishReason:
    """``length`` when the completion used its whole budget without meeting a stop."""
    return "length" if not stopped and completion_tokens >= max_tokens else "stop"


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
