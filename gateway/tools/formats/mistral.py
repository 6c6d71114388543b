"""Mistral's calls: a JSON list after ``[TOOL_CALLS]``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.tools.formats.base import Function, ToolFormat, call_arguments, dumps
from gateway.tools.formats.markers import LeadingCalls
from gateway.tools.parsing import ObjectCalls, Parser


class Mistral(ToolFormat):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (Mistral)."""

    name = "mistral"
    special_tokens = ("[TOOL_CALLS]",)

    def howto(self) -> str:
        return (
            'To call functions, write [TOOL_CALLS][{"name": <function-name>, '
            '"arguments": <args-json-object>}, ...]'
        )

    def render_calls(self, calls: Sequence[dict[str, Any]]) -> str:
        bodies = []
        for call in calls:
            name, arguments = call_arguments(call)
            bodies.append({"name": name, "arguments": arguments})
        return "[TOOL_CALLS]" + dumps(bodies)

    def render_result(self, content: str) -> str:
        return f"[TOOL_RESULTS]{content}[/TOOL_RESULTS]"

    def parser(self, functions: Sequence[Function] = ()) -> Parser:
        # ``[TOOL_CALLS]`` is a special token: postprocessing may already have dropped it.
        return LeadingCalls(("[TOOL_CALLS]",), "[{", ObjectCalls)
