"""Reasoning formats: a model's thinking split from its answer, chosen per model by name or
from its chat template."""

from __future__ import annotations

from collections.abc import Callable

from gateway.tools.reasoning.base import PromptState, ReasoningFormat
from gateway.tools.reasoning.harmony import Harmony
from gateway.tools.reasoning.think import Think

REASONING_FORMATS: dict[str, Callable[[], ReasoningFormat]] = {
    "think": Think,
    "harmony": Harmony,
}


def reasoning_format(name: str | None, template: str) -> ReasoningFormat | None:
    """The format called ``name`` (``none``: no reasoning), else the one ``template`` shows."""
    if name == "none":
        return None
    chosen = name or guess_reasoning(template)
    return REASONING_FORMATS[chosen]() if chosen else None


def guess_reasoning(template: str) -> str | None:
    """The reasoning format a chat template writes, where it is unambiguous."""
    if "<|channel|>" in template and "analysis" in template:
        return "harmony"
    if "<think>" in template and "</think>" in template:
        return "think"
    return None


__all__ = ["REASONING_FORMATS", "PromptState", "ReasoningFormat", "reasoning_format"]
