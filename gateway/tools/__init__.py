"""Tool calls and structured output, free of any API's schema: guides, the models' call formats,
generated text parsed into calls."""

from gateway.tools.output import OutputRules, conversation
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
]
