"""A parser of calls between two markers, for formats whose calls open with more than a JSON
object (XML-like parameters, a name before its JSON): content streams as it comes; a call starts
once its opening (the function's name) is whole, and its arguments stream as the format allows
(JSON as written, named parameters each once it is complete), or the call is read whole at its
end marker for a format that cannot tell its opening apart early."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.tools.formats.base import Function
from gateway.tools.parsing import (
    Arguments,
    CallStart,
    Content,
    Parser,
    Piece,
    call_id,
    partial_suffix,
)


@dataclass(frozen=True, slots=True)
class ReadCall:
    """A call read from the text between its markers."""

    name: str
    arguments: str
    id: str | None = None
    """The id the model wrote (Kimi K2's ``functions.NAME:0``), kept for the next turn."""


Reader = Callable[[str], ReadCall | None]


@dataclass(frozen=True, slots=True)
class Opening:
    """A call's opening, whole: its function, the id the model wrote, and where in the call's
    text its arguments begin."""

    name: str
    start: int
    id: str | None = None


OpeningFinder = Callable[[str], Opening | None]
"""The opening of a call whose text so far is given, once it is whole."""


class ArgumentStream:
    """How a format's call text becomes a call as it grows: ``open`` finds its opening,
    ``more`` gives the arguments certain so far, ``close`` the whole arguments at the call's
    end; each result extends the one before."""

    def __init__(self, open_: OpeningFinder) -> None:
        self.open = open_

    def more(self, text: str) -> str:
        """The JSON arguments certain from the argument text so far."""
        raise NotImplementedError

    def close(self, text: str) -> str:
        """The JSON arguments of the whole argument text."""
        raise NotImplementedError


class JsonStream(ArgumentStream):
    """Arguments that are JSON as written: streamed as they come, less trailing whitespace and
    the backticks of a closing fence, which may end them."""

    def more(self, text: str) -> str:
        return text.lstrip().rstrip(" \t\r\n`")

    def close(self, text: str) -> str:
        return self.more(text) or "{}"


class ParameterStream(ArgumentStream):
    """Arguments written as named parameters (``pattern`` finds each whole one's name and text),
    given as JSON one parameter at a time, each typed by ``properties``."""

    def __init__(
        self, open_: OpeningFinder, pattern: re.Pattern[str], properties: dict[str, Any]
    ) -> None:
        super().__init__(open_)
        self.pattern = pattern
        self.properties = properties

    def more(self, text: str) -> str:
        members = [
            f"{_dumps(key.strip())}: {_dumps(typed_value(value, self.properties.get(key.strip())))}"
            for key, value in self.pattern.findall(text)
        ]
        return "{" + ", ".join(members) if members else ""

    def close(self, text: str) -> str:
        so_far = self.more(text)
        return so_far + "}" if so_far else "{}"


class DelimitedCalls(Parser):
    """Content, and calls between ``begin`` and ``end``; with a ``section`` (open, close),
    calls are only inside it and what lies between them there is dropped. A call that
    ``read`` cannot make sense of, or that never ends, is given back as content."""

    def __init__(
        self,
        begin: str,
        end: str,
        read: Reader,
        section: tuple[str, str] | None = None,
        stream: ArgumentStream | None = None,
    ) -> None:
        super().__init__()
        self.begin, self.end, self.read = begin, end, read
        self.section = section
        self.stream = stream
        self.opening: Opening | None = None
        """The open call's opening, once whole (its arguments then stream)."""
        self.sent = ""
        self.where = "outside"
        self.held = ""
        self.raw = ""
        """The text of the open call, given back if it does not parse."""
        self.opened = ""
        """The open section's whole text, given back if no call in it parses."""
        self.section_calls = 0

    def feed(self, text: str) -> list[Piece]:
        self.held += text
        while self.held and self._step():
            pass
        return self._take()

    def _markers(self) -> tuple[str, ...]:
        if self.where == "call":
            return (self.end,)
        if self.where == "section":
            assert self.section is not None
            return (self.begin, self.section[1])
        return (self.section[0],) if self.section else (self.begin,)

    def _step(self) -> bool:
        markers = self._markers()
        found = [(i, m) for m in markers if (i := self.held.find(m)) >= 0]
        if not found:
            cut = min(partial_suffix(self.held, m) for m in markers)
            self._text(self.held[:cut])
            if self.where != "outside":
                self.opened += self.held[:cut]
            self.held = self.held[cut:]
            return False
        index, marker = min(found)
        self._text(self.held[:index])
        self.opened += self.held[: index + len(marker)] if self.where != "outside" else marker
        self.held = self.held[index + len(marker) :]
        self._marker(marker)
        return True

    def _text(self, text: str) -> None:
        if self.where == "outside":
            if text:
                self.pieces.append(Content(text))
            return
        self.raw += text
        if self.where == "call" and self.stream is not None and text:
            self._stream(self.stream, closing=False)

    def _stream(self, stream: ArgumentStream, *, closing: bool) -> None:
        """The open call's start, once its opening is whole, and its arguments since."""
        if self.opening is None:
            self.opening = stream.open(self.raw)
            if self.opening is None:
                return
            self.pieces.append(
                CallStart(self.calls, self.opening.id or call_id(), self.opening.name)
            )
            self.calls += 1
            self.section_calls += 1
            self.sent = ""
        text = self.raw[self.opening.start :]
        arguments = stream.close(text) if closing else stream.more(text)
        if len(arguments) > len(self.sent) and arguments.startswith(self.sent):
            self.pieces.append(Arguments(self.calls - 1, arguments[len(self.sent) :]))
            self.sent = arguments

    def _end_call(self) -> bool:
        """Close a streamed call; False where the open call never opened (read it whole)."""
        if self.stream is None or self.opening is None:
            return False
        self._stream(self.stream, closing=True)
        self.opening, self.raw = None, ""
        return True

    def _marker(self, marker: str) -> None:
        if self.where == "call":
            if not self._end_call():
                self._call(self.raw)
            self.raw = ""
            self.where = "section" if self.section else "outside"
        elif self.where == "section":
            # What the model writes between calls in their section is no one's content.
            self.where = "call" if marker == self.begin else "outside"
            self.raw = ""
            if self.where == "outside" and not self.section_calls:
                self.pieces.append(Content(self.opened))
        else:
            self.where = "section" if self.section else "call"
            self.section_calls = 0

    def _call(self, body: str) -> None:
        call = self.read(body)
        if call is None:
            self.pieces.append(Content(self.begin + body + self.end))
            return
        self.pieces.append(CallStart(self.calls, call.id or call_id(), call.name))
        self.pieces.append(Arguments(self.calls, call.arguments))
        self.calls += 1
        self.section_calls += 1

    def _flush(self) -> None:
        rest = self.held
        if self.where == "call" and self.opening is not None:
            # A call cut off after its opening stays a call, its arguments as far as they came.
            self.raw += rest
            self._end_call()
            rest = ""
            self.where = "section" if self.section else "outside"
        if self.section and self.where != "outside" and not self.section_calls:
            rest = self.opened + rest
        elif self.where == "call":
            rest = self.begin + self.raw + rest
        if rest and (self.where != "section" or rest.strip()):
            self.pieces.append(Content(rest))
        self.held, self.raw = "", ""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _types(schema: Any) -> set[str]:
    """The JSON types a parameter schema allows (``anyOf``/``oneOf`` and type lists read)."""
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    types = {kind} if isinstance(kind, str) else set(kind or ())
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            types |= _types(option)
    return types - {"null"}


def typed_value(text: str, schema: Any) -> Any:
    """A parameter written as text, as the value its schema asks for: strings stay text (one of
    an ``enum`` or ``const`` without the whitespace around it, which the XML grammars allow as
    layout), numbers, booleans, objects and lists are read as JSON where they parse (as is
    anything of a parameter the schema does not type)."""
    if "string" in _types(schema):
        fixed = isinstance(schema, dict) and ("enum" in schema or "const" in schema)
        return text.strip() if fixed else text
    try:
        return json.loads(text)
    except ValueError:
        return text


LAYOUT_LIMIT = 16
"""Most whitespace characters in a row a guided call may write between its parts: the grammars
allow any layout there, and a model that pads without end never finishes its call."""


def parameters_of(functions: Sequence[Function], name: str) -> dict[str, Any]:
    """The ``properties`` of function ``name``'s schema (empty if unknown)."""
    for function in functions:
        if function.name == name:
            properties = function.schema.get("properties")
            return properties if isinstance(properties, dict) else {}
    return {}


def xml_arguments(pairs: Sequence[tuple[str, str]], properties: dict[str, Any]) -> str:
    """Named parameters written as text, as JSON arguments."""
    return json.dumps(
        {key: typed_value(value, properties.get(key)) for key, value in pairs},
        ensure_ascii=False,
    )


FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL)


def parameter_calls(
    functions: Sequence[Function],
    opening: Callable[[str], Opening | None],
    name_of: Callable[[str], str | None],
    pair: re.Pattern[str],
) -> Parser:
    """The parser of calls between ``<tool_call>`` and ``</tool_call>`` whose arguments are
    named parameters (``pair`` matches one: its key and its text value), typed by each
    function's schema and streamed one parameter at a time once ``opening`` has found the
    function's name; ``name_of`` reads the name from a whole call (None: not a call)."""

    def read(body: str) -> ReadCall | None:
        name = name_of(body)
        if name is None:
            return None
        pairs = [(key.strip(), value) for key, value in pair.findall(body)]
        return ReadCall(name, xml_arguments(pairs, parameters_of(functions, name)))

    def parameters(text: str) -> Opening | None:
        found = opening(text)
        if found is not None:
            stream.properties = parameters_of(functions, found.name)
        return found

    stream = ParameterStream(parameters, pair, {})
    return DelimitedCalls("<tool_call>", "</tool_call>", read, stream=stream)


def parameter_tag(function: Function, begin: str, end: str, style: str) -> dict[str, Any]:
    """A structural tag whose content is ``function``'s arguments in one of xgrammar's XML
    parameter styles: values text where the schema says string, JSON where it says anything
    else, the whitespace around them bounded."""
    return {
        "begin": begin,
        "content": {
            "type": "json_schema",
            "json_schema": function.schema,
            "style": style,
            "max_whitespace_cnt": LAYOUT_LIMIT,
        },
        "end": end,
    }
