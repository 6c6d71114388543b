"""Tool-call formats of model families: how calls look in text, how to describe tools to a
template that cannot, how to read calls back, and the structural tag that guides ``auto``."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.tools.parsing import (
    Arguments,
    CallStart,
    Content,
    LeadingCalls,
    ObjectCalls,
    Parser,
    Piece,
    TaggedCalls,
    call_id,
)

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class Function:
    """A callable function of a request's ``tools``."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON schema of its arguments."""
        return self.parameters or EMPTY_PARAMETERS

    def as_tool(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry, as chat templates take it."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.schema}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def json_arguments(arguments: Any) -> Any:
    """Arguments sent as a JSON string, parsed; anything else as it is."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments


def _arguments(call: dict[str, Any]) -> tuple[str, Any]:
    """Name and arguments (parsed when they are JSON) of a history ``tool_calls`` entry."""
    function = call.get("function", call)
    return str(function.get("name", "")), json_arguments(function.get("arguments", {}))


class ToolFormat:
    """One family's format; subclasses fill in the text forms."""

    name = ""
    args_key = "arguments"
    separator: str | None = None
    """What the format writes between two calls, where its calls have a ``call_tag``."""

    def instructions(self, functions: Sequence[Function]) -> str:
        """A system message describing the tools, for templates that take no ``tools``."""
        listing = "\n".join(_dumps(f.as_tool()) for f in functions)
        return (
            "You may call one or more functions to answer. Function signatures:\n"
            f"{listing}\n\n{self.howto()}"
        )

    def howto(self) -> str:
        """How a call must be written."""
        raise NotImplementedError

    def render_calls(self, calls: Sequence[dict[str, Any]]) -> str:
        """An assistant message's ``tool_calls`` written as the model writes them."""
        raise NotImplementedError

    def render_result(self, content: str) -> str:
        """A tool's result as the text of a user turn."""
        return content

    def parser(self) -> Parser:
        """A parser of free output with calls in this format."""
        raise NotImplementedError

    def call_tag(self, function: Function) -> dict[str, Any] | None:
        """An xgrammar tag ``{begin, content, end}`` for one call, or None."""
        return None

    def trigger(self) -> str | None:
        """Text whose appearance starts a call in free output, or None."""
        return None


class Hermes(ToolFormat):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Hermes, Qwen 2.5+)."""

    name = "hermes"
    separator = "\n"

    def howto(self) -> str:
        return (
            "For each call, write <tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def render_calls(self, calls: Sequence[dict[str, Any]]) -> str:
        texts = []
        for call in calls:
            name, arguments = _arguments(call)
            body = _dumps({"name": name, self.args_key: arguments})
            texts.append(f"<tool_call>\n{body}\n</tool_call>")
        return "\n".join(texts)

    def render_result(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def parser(self) -> Parser:
        return TaggedCalls("<tool_call>", "</tool_call>")

    def call_tag(self, function: Function) -> dict[str, Any] | None:
        return {
            "begin": f'<tool_call>\n{{"name": {_dumps(function.name)}, "arguments": ',
            "content": {"type": "json_schema", "json_schema": function.schema},
            "end": "}\n</tool_call>",
        }

    def trigger(self) -> str | None:
        return "<tool_call>"


class Llama3Json(ToolFormat):
    """``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``, several
    separated by ``;`` (Llama 3.1+)."""

    name = "llama3_json"
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
            name, arguments = _arguments(call)
            bodies.append(_dumps({"name": name, "parameters": arguments}))
        return "; ".join(bodies)

    def parser(self) -> Parser:
        return LeadingCalls(
            ("<|python_tag|>",), "{", lambda: ObjectCalls(("parameters", "arguments"))
        )

    def call_tag(self, function: Function) -> dict[str, Any] | None:
        return {
            "begin": f'{{"name": {_dumps(function.name)}, "parameters": ',
            "content": {"type": "json_schema", "json_schema": function.schema},
            "end": "}",
        }

    def trigger(self) -> str | None:
        return '{"name": '


class Mistral(ToolFormat):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (Mistral)."""

    name = "mistral"

    def howto(self) -> str:
        return (
            'To call functions, write [TOOL_CALLS][{"name": <function-name>, '
            '"arguments": <args-json-object>}, ...]'
        )

    def render_calls(self, calls: Sequence[dict[str, Any]]) -> str:
        bodies = []
        for call in calls:
            name, arguments = _arguments(call)
            bodies.append({"name": name, "arguments": arguments})
        return "[TOOL_CALLS]" + _dumps(bodies)

    def render_result(self, content: str) -> str:
        return f"[TOOL_RESULTS]{content}[/TOOL_RESULTS]"

    def parser(self) -> Parser:
        # ``[TOOL_CALLS]`` is a special token: postprocessing may already have dropped it.
        return LeadingCalls(("[TOOL_CALLS]",), "[{", ObjectCalls)


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
            name, arguments = _arguments(call)
            items = arguments.items() if isinstance(arguments, dict) else ()
            texts.append(f"{name}({', '.join(f'{k}={v!r}' for k, v in items)})")
        return "[" + ", ".join(texts) + "]"

    def parser(self) -> Parser:
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
            self.pieces.append(Arguments(index, _dumps(arguments)))
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


FORMATS: dict[str, Callable[[], ToolFormat]] = {
    "hermes": Hermes,
    "llama3_json": Llama3Json,
    "mistral": Mistral,
    "pythonic": Pythonic,
}


def tool_format(name: str) -> ToolFormat:
    """The format called ``name`` (one of ``FORMATS``)."""
    return FORMATS[name]()


def guess_format(template: str | None) -> str:
    """The format a chat template's own tool-call text suggests; ``hermes`` otherwise."""
    text = template or ""
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<|python_tag|>" in text or "ipython" in text:
        return "llama3_json"
    if "<tool_call>" in text:
        return "hermes"
    return "hermes"
