"""Tool calls, structured output and reasoning, free of any API's schema: guides, the models'
call and reasoning formats, generated text parsed into reasoning, content and calls."""

from gateway.tools.output import OutputRules, conversation, model_formats, special_tokens_read
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
    "model_formats",
    "special_tokens_read",
]
