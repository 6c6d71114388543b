"""GLM 4.5+'s calls: ``<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>
...</tool_call>``; values are text, typed by the tool's schema."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gateway.tools.formats.base import Function, ToolFormat, call_arguments, dumps
from gateway.tools.formats.delimited import Opening, parameter_calls, parameter_tag
from gateway.tools.parsing import Parser

_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_NAME = re.compile(r"\s*([^\s<>{}]+)(?=\s|<arg_key>)")
"""The function's name, whole once a space or the first parameter follows it."""


def _name_of(body: str) -> str | None:
    name = body.split("<arg_key>", 1)[0].strip()
    if not name or any(ch.isspace() or ch in "<>{}" for ch in name):
        return None
    return name


def opening(text: str) -> Opening | None:
    match = _NAME.match(text)
    return Opening(match.group(1), match.end()) if match else None


class Glm45(ToolFormat):
    """GLM 4.5, 4.6 and 4.7."""

    name = "glm45"
    separator = "\n"
    special_tokens = (
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    )

    def howto(self) -> str:
        return (
            "For each call, write <tool_call>FUNCTION-NAME\n<arg_key>PARAMETER-NAME</arg_key>\n"
            "<arg_value>VALUE</arg_value>\n</tool_call>"
        )

    def render_calls(self, calls: Sequence[dict[str, Any]]) -> str:
        texts = []
        for call in calls:
            name, arguments = call_arguments(call)
            items = arguments.items() if isinstance(arguments, dict) else ()
            pairs = "".join(
                f"<arg_key>{key}</arg_key>\n"
                f"<arg_value>{value if isinstance(value, str) else dumps(value)}</arg_value>\n"
                for key, value in items
            )
            texts.append(f"<tool_call>{name}\n{pairs}</tool_call>")
        return "\n".join(texts)

    def render_result(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def parser(self, functions: Sequence[Function] = ()) -> Parser:
        return parameter_calls(functions, opening, _name_of, _PAIR)

    def call_tag(self, function: Function) -> dict[str, Any] | None:
        # xgrammar's glm_xml style: <arg_key>KEY</arg_key><arg_value>VALUE</arg_value> pairs.
        return parameter_tag(function, f"<tool_call>{function.name}", "</tool_call>", "glm_xml")

    def trigger(self) -> str | None:
        return "<tool_call>"
