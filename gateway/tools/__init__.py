"""Tool calls, structured output and reasoning: request fields to guides, generated text to
reasoning, content and calls."""

from gateway.tools.output import OutputRules, conversation, output_rules, response_guide
from gateway.tools.parsing import (
    Arguments,
    CallStart,
    Content,
    Folded,
    Parser,
    Piece,
    Reasoning,
)

__all__ = [
    "Arguments",
    "CallStart",
    "Content",
    "Folded",
    "OutputRules",
    "Parser",
    "Piece",
    "Reasoning",
    "conversation",
    "output_rules",
    "response_guide",
]
