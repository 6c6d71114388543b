"""The one Plan: everything needed to run an API request's choices and shape its answer."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from adapters.contract import PromptImage, SamplingParams


@dataclass(frozen=True, slots=True)
class Prompt:
    """A templated prompt and its length in the model's tokens.

    ``shown`` is what ``echo`` repeats when it differs from the text sent (an empty prompt is
    sent as the tokenizer's start-of-text token).
    """

    text: str
    token_count: int
    shown: str | None = None
    ids: tuple[int, ...] = ()
    """The prompt's token ids as the engine takes them (special tokens included)."""
    images: tuple[PromptImage, ...] = ()
    """Its images, in the order the text marks their places (``token_count`` counts them)."""
    exact_count: int | None = None
    """``token_count`` where the tokenizer that made the prompt counted exactly what the engine
    gets from ``text`` through a preprocessing model; None where only the engine knows (a prompt
    with images, one made elsewhere)."""

    @property
    def echoed(self) -> str:
        """The prompt as the client wrote it."""
        return self.text if self.shown is None else self.shown


@dataclass(frozen=True, slots=True)
class ChoiceSpec:
    """One backend request: the ``index``-th choice of the answer."""

    index: int
    prompt_index: int
    prompt: Prompt
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything needed to run one API request and shape its answer."""

    model: str
    choices: tuple[ChoiceSpec, ...]
    stream: bool
    include_usage: bool
    logprobs: bool = False
    echo: bool = False
    images: Callable[[], Awaitable[tuple[PromptImage, ...]]] | None = None
    """Loads the images of the prompt (a chat has one), once the request is admitted: the
    plan counts them in its tokens without fetching or decoding them."""

    async def with_images(self) -> Plan:
        """The plan with its images loaded into every choice's prompt."""
        if self.images is None:
            return self
        images = await self.images()
        choices = tuple(
            dataclasses.replace(
                choice,
                prompt=dataclasses.replace(choice.prompt, images=images, exact_count=None),
            )
            for choice in self.choices
        )
        return dataclasses.replace(self, choices=choices, images=None)
