"""What a tool-call format is: how calls look in a family's text, how to describe tools to a
template that cannot, how to read calls back, and the structural tag that guides ``auto``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.tools.parsing import Parser

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


def dumps(value: Any) -> str:
    """JSON as the models write it (non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False)


def json_arguments(arguments: Any) -> Any:
    """Arguments sent as a JSON string, parsed; anything else as it is."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments


def call_arguments(call: dict[str, Any]) -> tuple[str, Any]:
    """Name and arguments (parsed when they are JSON) of a history ``tool_calls`` entry."""
    function = call.get("function", call)
    return str(function.get("name", "")), json_arguments(function.get("arguments", {}))


class ToolFormat:
    """One family's format; subclasses fill in the text forms."""

    name = ""
    args_key = "arguments"
    separator: str | None = None
    """What the format writes between two calls, where its calls have a ``call_tag``."""
    reads_reasoning = False
    """Whether its parser splits the reasoning off itself (calls are messages of channels)."""
    special_tokens: tuple[str, ...] = ()
    """Markers its parser reads that tokenizers may hold as special tokens, which the model's
    decoding must therefore keep."""

    def instructions(self, functions: Sequence[Function]) -> str:
        """A system message describing the tools, for templates that take no ``tools``."""
        listing = "\n".join(dumps(f.as_tool()) for f in functions)
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

    def parser(self, functions: Sequence[Function] = ()) -> Parser:
        """A parser of free output with calls in this format (``functions``: the request's,
        whose schemas give the types of arguments a format writes as text)."""
        raise NotImplementedError

    def call_tag(self, function: Function) -> dict[str, Any] | None:
        """An xgrammar tag ``{begin, content, end}`` for one call, or None."""
        return None

    def trigger(self) -> str | None:
        """Text whose appearance starts a call in free output, or None."""
        return None

    def auto_format(self, functions: Sequence[Function], parallel: bool) -> dict[str, Any] | None:
        """An xgrammar structural-tag format for ``auto``: free text, and a call in this
        format once its trigger appears; None where the format has no call tags."""
        trigger = self.trigger()
        tags = [self.call_tag(function) for function in functions]
        if trigger is None or not tags or any(tag is None for tag in tags):
            return None
        return {
            "type": "triggered_tags",
            "triggers": [trigger],
            "tags": tags,
            "stop_after_first": not parallel,
        }

    def required_format(
        self, functions: Sequence[Function], parallel: bool
    ) -> dict[str, Any] | None:
        """An xgrammar structural-tag format for ``required``: one call or more in this format
        and nothing else, the end allowed after each; None where the format has no call tags."""
        tags = [self.call_tag(function) for function in functions]
        if self.separator is None or not tags or any(tag is None for tag in tags):
            return None
        return {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": self.separator,
            "at_least_one": True,
            "stop_after_first": not parallel,
        }


class SectionFormat(ToolFormat):
    """A format whose calls all lie in one section between two markers (DeepSeek, Kimi)."""

    section = ("", "")
    call_begin = ""
    """The marker opening one call, which free text outside the section may not hold."""

    def call_tags(self, function: Function) -> list[dict[str, Any]]:
        """xgrammar tags of one call inside the section (one per form the family writes)."""
        raise NotImplementedError

    def trigger(self) -> str | None:
        return self.section[0]

    def _calls(self, functions: Sequence[Function], parallel: bool) -> dict[str, Any]:
        return {
            "type": "tags_with_separator",
            "tags": [tag for function in functions for tag in self.call_tags(function)],
            "separator": "",
            "at_least_one": True,
            "stop_after_first": not parallel,
        }

    def auto_format(self, functions: Sequence[Function], parallel: bool) -> dict[str, Any] | None:
        if not functions:
            return None
        begin, end = self.section
        section = {
            "type": "tag",
            "begin": begin,
            "content": self._calls(functions, parallel),
            "end": end,
        }
        return {
            "type": "triggered_tags",
            "triggers": [begin],
            "tags": [section],
            "stop_after_first": not parallel,
            "excludes": [self.call_begin],
        }

    def required_format(
        self, functions: Sequence[Function], parallel: bool
    ) -> dict[str, Any] | None:
        if not functions:
            return None
        begin, end = self.section
        return {
            "type": "sequence",
            "elements": [
                {"type": "const_string", "value": begin},
                self._calls(functions, parallel),
                {"type": "const_string", "value": end},
            ],
        }
