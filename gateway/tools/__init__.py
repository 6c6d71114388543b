"""Tool calls, structured output and reasoning, free of any API's schema: guides, the models'
call and reasoning formats, generated text parsed into reasoning, content and calls."""

from gateway.tools.formats import ToolFormat
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
from gateway.tools.reasoning import ReasoningFormat

__all__ = [
    "Arguments",
    "CallStart",
    "Content",
    "Folded",
    "OutputRules",
    "Parser",
    "Piece",
    "Reasoning",
    "ReasoningFormat",
    "ToolFormat",
    "conversation",
    "model_formats",
    "special_tokens_read",
]
