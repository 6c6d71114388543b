"""Llama 3.1+'s JSON calls, after an optional ``<|python_tag|>``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.tools.formats.base import Function, ToolFormat, call_arguments, dumps
from gateway.tools.formats.markers import LeadingCalls
from gateway.tools.parsing import ObjectCalls, Parser


class Llama3Json(ToolFormat):
    """``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``, several
    separated by ``;`` (Llama 3.1+)."""

    name = "llama3_json"
    special_tokens = ("<|python_tag|>",)
    args_key = "parameters"
    separator = "; "

    def howto(self) -> str:
        return (
            "To call a function, respond only with JSON in the format "
            '{"name": function name, "parameters": dictionary of argument name and its value}.'
        )

    def render_calls(self, calls: Sequence[dict[str, Any]]) -> str:
        bodies = []
        for call in calls:
            name, arguments = call_arguments(call)
            bodies.append(dumps({"name": name, "parameters": arguments}))
        return "; ".join(bodies)

    def parser(self, functions: Sequence[Function] = ()) -> Parser:
        return LeadingCalls(
            ("<|python_tag|>",), "{", lambda: ObjectCalls(("parameters", "arguments"))
        )

    def call_tag(self, function: Function) -> dict[str, Any] | None:
        return {
            "begin": f'{{"name": {dumps(function.name)}, "parameters": ',
            "content": {"type": "json_schema", "json_schema": function.schema},
            "end": "}",
        }

    def trigger(self) -> str | None:
        return '{"name": '
