"""What a reasoning format is: how a model's thinking is told apart from its answer."""

from __future__ import annotations

from typing import Any, Literal

from gateway.tools.parsing import Parser

PromptState = Literal["open", "closed", "free"]
"""Where the prompt leaves the model: inside its reasoning (the template opened it), past it
(the template wrote an empty one: thinking is off), or free to reason or not."""


class ReasoningFormat:
    """One family's reasoning; subclasses fill in the text forms."""

    name = ""
    special_tokens: tuple[str, ...] = ()
    """Markers its splitter reads that tokenizers may hold as special tokens, which the
    model's decoding must therefore keep."""

    def state(self, prompt: str) -> PromptState:
        """Where the templated ``prompt`` leaves the model."""
        raise NotImplementedError

    def splitter(self, inner: Parser, state: PromptState, calls: tuple[str, ...] = ()) -> Parser:
        """A parser giving reasoning pieces and the answer's text to ``inner``; ``calls``: texts
        that begin a tool call, which end the reasoning where the model wrote no end."""
        raise NotImplementedError

    def guide_format(self, inner: dict[str, Any], state: PromptState) -> dict[str, Any]:
        """An xgrammar structural-tag format letting the reasoning come before ``inner``."""
        raise NotImplementedError
