"""Qwen3-Coder's XML calls: ``<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>
...</function>\n</tool_call>``; values are text, typed by the tool's schema."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gateway.tools.formats.base import Function, ToolFormat, call_arguments, dumps
from gateway.tools.formats.delimited import Opening, parameter_calls, parameter_tag
from gateway.tools.parsing import Parser

_FUNCTION = re.compile(r"<function=([^>\n]+)>")
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _name_of(body: str) -> str | None:
    match = _FUNCTION.search(body)
    return match.group(1).strip() if match else None


def opening(text: str) -> Opening | None:
    """``<function=NAME>``, once its ``>`` has come."""
    match = _FUNCTION.search(text)
    return Opening(match.group(1).strip(), match.end()) if match else None


class Qwen3Coder(ToolFormat):
    """Qwen3-Coder (and Qwen3.5+'s XML form)."""

    name = "qwen3_coder"
    separator = "\n"
    special_tokens = ("<tool_call>", "</tool_call>")

    def howto(self) -> str:
        return (
            "For each call, write <tool_call>\n<function=FUNCTION-NAME>\n"
            "<parameter=PARAMETER-NAME>\nVALUE\n</parameter>\n</function>\n</tool_call>"
        )

    def render_calls(self, calls: Sequence[dict[str, Any]]) -> str:
        texts = []
        for call in calls:
            name, arguments = call_arguments(call)
            items = arguments.items() if isinstance(arguments, dict) else ()
            params = "".join(
                f"<parameter={key}>\n{value if isinstance(value, str) else dumps(value)}\n"
                "</parameter>\n"
                for key, value in items
            )
            texts.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
        return "\n".join(texts)

    def render_result(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def parser(self, functions: Sequence[Function] = ()) -> Parser:
        return parameter_calls(functions, opening, _name_of, _PARAMETER)

    def call_tag(self, function: Function) -> dict[str, Any] | None:
        # xgrammar's qwen_xml style: each parameter a <parameter=KEY> element.
        begin = f"<tool_call>\n<function={function.name}>\n"
        return parameter_tag(function, begin, "\n</function>\n</tool_call>", "qwen_xml")

    def trigger(self) -> str | None:
        return "<tool_call>"
