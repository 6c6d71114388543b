"""Pythonic calls (Llama 3.2 and 4, several small models): a Python list of calls."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

from gateway.tools.formats.base import Function, ToolFormat, call_arguments, dumps
from gateway.tools.formats.markers import LeadingCalls
from gateway.tools.parsing import Arguments, CallStart, Content, Parser, Piece, call_id


class Pythonic(ToolFormat):
    """``[get_weather(city="Paris"), ...]`` (Llama 3.2 and 4, several small models)."""

    name = "pythonic"

    def howto(self) -> str:
        return (
            "To call functions, respond only with a Python list of calls, e.g. "
            '[func_name1(param1="value1"), func_name2(param2=2)]'
        )

    def render_calls(self, calls: Sequence[dict[str, Any]]) -> str:
        texts = []
        for call in calls:
            name, arguments = call_arguments(call)
            items = arguments.items() if isinstance(arguments, dict) else ()
            texts.append(f"{name}({', '.join(f'{k}={v!r}' for k, v in items)})")
        return "[" + ", ".join(texts) + "]"

    def parser(self, functions: Sequence[Function] = ()) -> Parser:
        return LeadingCalls((), "[", PythonicList)


class PythonicList(Parser):
    """A whole pythonic call list, read when the output ends (Python syntax is not streamable)."""

    def __init__(self) -> None:
        super().__init__()
        self.text = ""

    def feed(self, text: str) -> list[Piece]:
        self.text += text
        return []

    def _flush(self) -> None:
        calls = _pythonic_calls(self.text)
        if calls is None:
            self.pieces.append(Content(self.text))
            return
        for index, (name, arguments) in enumerate(calls):
            self.pieces.append(CallStart(index, call_id(), name))
            self.pieces.append(Arguments(index, dumps(arguments)))
        self.calls = len(calls)


def _pythonic_calls(text: str) -> list[tuple[str, dict[str, Any]]] | None:
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return None
    if not isinstance(tree.body, ast.List):
        return None
    calls = []
    for element in tree.body.elts:
        if not isinstance(element, ast.Call) or not isinstance(element.func, ast.Name):
            return None
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in element.keywords if kw.arg}
        except ValueError:
            return None
        calls.append((element.func.id, arguments))
    return calls
