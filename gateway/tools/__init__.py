"""Tool calls and structured output: request fields to guides, generated text to calls."""

from gateway.tools.output import OutputRules, conversation, output_rules, response_guide
from gateway.tools.parsing import Arguments, CallStart, Content, Folded, Parser, Piece

__all__ = [
    "Arguments",
    "CallStart",
    "Content",
    "Folded",
    "OutputRules",
    "Parser",
    "Piece",
    "conversation",
    "output_rules",
    "response_guide",
]
