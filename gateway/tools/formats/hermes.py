"""Hermes' calls (Hermes, Qwen 2.5 and 3): JSON objects between ``<tool_call>`` tags."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.tools.formats.base import Function, ToolFormat, call_arguments, dumps
from gateway.tools.formats.markers import TaggedCalls
from gateway.tools.parsing import Parser


class Hermes(ToolFormat):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Hermes, Qwen 2.5+)."""

    name = "hermes"
    separator = "\n"
    special_tokens = ("<tool_call>", "</tool_call>")

    def howto(self) -> str:
        return (
            "For each call, write <tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def render_calls(self, calls: Sequence[dict[str, Any]]) -> str:
        texts = []
        for call in calls:
            name, arguments = call_arguments(call)
            body = dumps({"name": name, self.args_key: arguments})
            texts.append(f"<tool_call>\n{body}\n</tool_call>")
        return "\n".join(texts)

    def render_result(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def parser(self, functions: Sequence[Function] = ()) -> Parser:
        return TaggedCalls("<tool_call>", "</tool_call>")

    def call_tag(self, function: Function) -> dict[str, Any] | None:
        return {
            "begin": f'<tool_call>\n{{"name": {dumps(function.name)}, "arguments": ',
            "content": {"type": "json_schema", "json_schema": function.schema},
            "end": "}\n</tool_call>",
        }

    def trigger(self) -> str | None:
        return "<tool_call>"
