"""Tool calls and structured output: request fields to guides, generated text to calls."""

from gateway.tools.parsing import Arguments, CallStart, Content, Folded, Parser, Piece
from gateway.tools.plan import OutputPlan, conversation, plan_output, response_guide

__all__ = [
    "Arguments",
    "CallStart",
    "Content",
    "Folded",
    "OutputPlan",
    "Parser",
    "Piece",
    "conversation",
    "plan_output",
    "response_guide",
]
