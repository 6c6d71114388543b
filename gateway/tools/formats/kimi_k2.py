"""Kimi K2's calls, inside ``<|tool_calls_section_begin|>…<|tool_calls_section_end|>``:
``<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>ARGS<|tool_call_end|>``.
The call's id is the model's own ``functions.NAME:INDEX``, which its template writes back in
the next turn."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gateway.tools.formats.base import Function, SectionFormat, call_arguments, dumps
from gateway.tools.formats.delimited import (
    LAYOUT_LIMIT,
    DelimitedCalls,
    JsonStream,
    Opening,
    ReadCall,
)
from gateway.tools.parsing import Parser

SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
CALL = ("<|tool_call_begin|>", "<|tool_call_end|>")
ARGUMENTS = "<|tool_call_argument_begin|>"
_ID = re.compile(r"^(?:functions\.)?([\w.\-]+):(\d+)$")


def opening(text: str) -> Opening | None:
    """``functions.NAME:INDEX<|tool_call_argument_begin|>``, once whole."""
    head, sep, _ = text.partition(ARGUMENTS)
    match = _ID.match(head.strip())
    if not sep or match is None:
        return None
    return Opening(match.group(1), len(head) + len(sep), id=head.strip())


def read_call(body: str) -> ReadCall | None:
    """``functions.NAME:INDEX<|tool_call_argument_begin|>ARGS``; an id that names no
    function is not a call."""
    head, sep, arguments = body.partition(ARGUMENTS)
    match = _ID.match(head.strip())
    if not sep or match is None:
        return None
    return ReadCall(match.group(1), arguments.strip() or "{}", id=head.strip())


class KimiK2(SectionFormat):
    """Kimi K2 (Instruct, Thinking)."""

    name = "kimi_k2"
    section = SECTION
    call_begin = CALL[0]
    special_tokens = (*SECTION, *CALL, ARGUMENTS)

    def howto(self) -> str:
        return (
            f"To call functions, write {SECTION[0]}, then for each call {CALL[0]}"
            f"functions.FUNCTION-NAME:INDEX{ARGUMENTS}ARGUMENTS-JSON{CALL[1]}, then {SECTION[1]}"
        )

    def render_calls(self, calls: Sequence[dict[str, Any]]) -> str:
        texts = []
        for index, call in enumerate(calls):
            name, arguments = call_arguments(call)
            call_id = call.get("id") or f"functions.{name}:{index}"
            texts.append(f"{CALL[0]}{call_id}{ARGUMENTS}{dumps(arguments)}{CALL[1]}")
        return SECTION[0] + "".join(texts) + SECTION[1]

    def parser(self, functions: Sequence[Function] = ()) -> Parser:
        stream = JsonStream(opening)
        return DelimitedCalls(CALL[0], CALL[1], read_call, section=SECTION, stream=stream)

    def call_tags(self, function: Function) -> list[dict[str, Any]]:
        arguments = {
            "type": "json_schema",
            "json_schema": function.schema,
            "max_whitespace_cnt": LAYOUT_LIMIT,
        }
        index = {"type": "regex", "pattern": r"\d+ ?"}
        content = {
            "type": "sequence",
            "elements": [index, {"type": "const_string", "value": ARGUMENTS}, arguments],
        }
        return [
            {"begin": f"{CALL[0]}functions.{function.name}:", "content": content, "end": CALL[1]}
        ]
