"""DeepSeek V3, R1 and V3.1's calls, inside ``<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>``:
``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`` (V3, R1)
or ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`` (V3.1). The markers are
special tokens, which the gateway's decoding keeps (``special_tokens``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gateway.tools.formats.base import Function, SectionFormat, call_arguments, dumps
from gateway.tools.formats.delimited import (
    FENCE,
    LAYOUT_LIMIT,
    DelimitedCalls,
    JsonStream,
    Opening,
    ReadCall,
)
from gateway.tools.parsing import Parser

SECTION = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
CALL = ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
SEP = "<｜tool▁sep｜>"


_FENCED = re.compile(r"([^\n]+)\n\s*```(?:json)?\s*(?=[\[{])")
"""V3/R1's ``NAME`` line and opening fence, whole once the JSON's first character follows."""


def opening(text: str) -> Opening | None:
    """A call's name, once its arguments begin."""
    head, sep, rest = text.partition(SEP)
    if not sep:
        return None
    start = len(head) + len(sep)
    if head.strip() != "function":
        return Opening(head.strip(), start) if head.strip() else None
    fenced = _FENCED.match(rest)
    return Opening(fenced.group(1).strip(), start + fenced.end()) if fenced else None


def read_call(body: str) -> ReadCall | None:
    """One call's text between its markers, in either generation's form."""
    head, sep, rest = body.partition(SEP)
    if not sep:
        return None
    if head.strip() == "function":
        name, _, text = rest.partition("\n")
        fenced = FENCE.search(text)
        arguments = fenced.group(1) if fenced else text.strip()
    else:
        name, arguments = head, rest.strip()
    name = name.strip()
    return ReadCall(name, arguments or "{}") if name else None


class DeepSeekV3(SectionFormat):
    """DeepSeek V3, R1 (0528) and V3.1."""

    name = "deepseek_v3"
    section = SECTION
    call_begin = CALL[0]
    special_tokens = (*SECTION, *CALL, SEP)

    def howto(self) -> str:
        return (
            f"To call functions, write {SECTION[0]}, then for each call {CALL[0]}function{SEP}"
            f"FUNCTION-NAME\n```json\nARGUMENTS-JSON\n```{CALL[1]}, then {SECTION[1]}"
        )

    def render_calls(self, calls: Sequence[dict[str, Any]]) -> str:
        texts = []
        for call in calls:
            name, arguments = call_arguments(call)
            body = f"function{SEP}{name}\n```json\n{dumps(arguments)}\n```"
            texts.append(CALL[0] + body + CALL[1])
        return SECTION[0] + "".join(texts) + SECTION[1]

    def parser(self, functions: Sequence[Function] = ()) -> Parser:
        stream = JsonStream(opening)
        return DelimitedCalls(CALL[0], CALL[1], read_call, section=SECTION, stream=stream)

    def call_tags(self, function: Function) -> list[dict[str, Any]]:
        # Both generations' forms: the guide cannot tell V3/R1 from V3.1, the model takes its own.
        schema = {
            "type": "json_schema",
            "json_schema": function.schema,
            "max_whitespace_cnt": LAYOUT_LIMIT,
        }
        fenced = {
            "begin": f"{CALL[0]}function{SEP}{function.name}\n```json\n",
            "content": schema,
            "end": f"\n```{CALL[1]}",
        }
        plain = {"begin": f"{CALL[0]}{function.name}{SEP}", "content": schema, "end": CALL[1]}
        return [fenced, plain]
