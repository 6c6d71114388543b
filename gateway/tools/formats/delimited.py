"""A parser of calls each read whole between two markers, for formats whose arguments are not
a JSON object as written (XML-like parameters, a name before its JSON): content streams as it
comes, each call is given once its end marker arrives."""

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


class DelimitedCalls(Parser):
    """Content, and calls between ``begin`` and ``end``; with a ``section`` (open, close),
    calls are only inside it and what lies between them there is dropped. A call that
    ``read`` cannot make sense of, or that never ends, is given back as content."""

    def __init__(
        self, begin: str, end: str, read: Reader, section: tuple[str, str] | None = None
    ) -> None:
        super().__init__()
        self.begin, self.end, self.read = begin, end, read
        self.section = section
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
        else:
            self.raw += text

    def _marker(self, marker: str) -> None:
        if self.where == "call":
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
        if self.section and self.where != "outside" and not self.section_calls:
            rest = self.opened + rest
        elif self.where == "call":
            rest = self.begin + self.raw + rest
        if rest and (self.where != "section" or rest.strip()):
            self.pieces.append(Content(rest))
        self.held, self.raw = "", ""


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
    """A parameter written as text, as the value its schema asks for: strings stay text,
    numbers, booleans, objects and lists are read as JSON where they parse (as is anything
    of a parameter the schema does not type)."""
    if "string" in _types(schema):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


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
