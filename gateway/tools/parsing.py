"""Incremental parsing of generated text into content and tool calls, chunk by chunk.

A parser is fed text deltas and returns pieces as soon as they are certain: content, the start
of a call (its name, once whole), and fragments of its JSON arguments. Whole answers feed the
whole text, so streamed and whole answers always agree.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field

from gateway.ids import rng

_ID_ALPHABET = string.ascii_letters + string.digits


def call_id() -> str:
    """An OpenAI-style tool call id (``call_`` and 24 random letters and digits)."""
    return "call_" + "".join(rng.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True, slots=True)
class Content:
    """Text for ``message.content``."""

    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Text for ``message.reasoning_content``: what the model thought before it answered."""

    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    """A tool call begins: its position among the answer's calls, id and function name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class Arguments:
    """More of the JSON arguments of call ``index``."""

    index: int
    text: str


Piece = Content | Reasoning | CallStart | Arguments


@dataclass(slots=True)
class ParsedCall:
    """A whole tool call, folded from its pieces."""

    id: str
    name: str
    arguments: str = ""


@dataclass(slots=True)
class Folded:
    """An answer's content and calls, folded from its pieces."""

    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    reasoning: str | None = None
    """None where the model wrote no reasoning."""

    def add(self, pieces: list[Piece]) -> None:
        """Take more pieces."""
        for piece in pieces:
            if isinstance(piece, Content):
                self.content += piece.text
            elif isinstance(piece, Reasoning):
                self.reasoning = (self.reasoning or "") + piece.text
            elif isinstance(piece, CallStart):
                self.calls.append(ParsedCall(piece.id, piece.name))
            else:
                self.calls[piece.index].arguments += piece.text


class CallScanner:
    """Reads one JSON object ``{"name": ..., "arguments": {...}}`` a character at a time.

    Keys may come in any order and the arguments key may be any of ``args_keys``; arguments are
    collected as the model wrote them, from their first character to their last.
    """

    def __init__(self, args_keys: tuple[str, ...] = ("arguments",)) -> None:
        self.args_keys = args_keys
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.expect = "object"
        self.key: str | None = None
        self.capture: list[str] | None = None
        self.capture_role = ""
        self.name: str | None = None
        self.args: list[str] = []
        self.args_open = False
        self.args_seen = False
        self.done = False

    def feed(self, ch: str) -> None:
        """Take one character of the object (nothing after its closing brace)."""
        if self.in_string:
            self._string_char(ch)
            return
        if ch.isspace():
            if self.args_open:
                self.args.append(ch)
            return
        if (
            self.depth == 1
            and self.expect == "value"
            and self.key in self.args_keys
            and not self.args_seen
        ):
            self.args_open = self.args_seen = True
        if self.args_open:
            self.args.append(ch)
        self._structure(ch)

    def _string_char(self, ch: str) -> None:
        if self.args_open:
            self.args.append(ch)
        if self.escape:
            self.escape = False
        elif ch == "\\":
            self.escape = True
        elif ch == '"':
            self.in_string = False
            if self.capture is not None:
                self._captured(json.loads('"' + "".join(self.capture) + '"'))
                return
        if self.capture is not None:
            self.capture.append(ch)

    def _captured(self, text: str) -> None:
        role, self.capture = self.capture_role, None
        if role == "key":
            self.key = text
            self.expect = "colon"
        else:
            self.name = text
            self.expect = "next"

    def _structure(self, ch: str) -> None:
        if ch == '"':
            self._open_string()
        elif ch in "{[":
            self.depth += 1
            if self.depth == 1:
                self.expect = "key"
        elif ch in "}]":
            self._close()
        elif self.depth == 1:
            self._punctuation(ch)

    def _open_string(self) -> None:
        self.in_string = True
        if self.depth != 1:
            return
        if self.expect == "key":
            self.capture, self.capture_role = [], "key"
        elif self.expect == "value" and self.key == "name":
            self.capture, self.capture_role = [], "name"
        elif self.expect == "value":
            self.expect = "next"

    def _punctuation(self, ch: str) -> None:
        if ch == ":" and self.expect == "colon":
            self.expect = "value"
        elif ch == ",":
            self._end_scalar()
            self.expect = "key"
        elif self.expect == "value":
            self.expect = "next"

    def _close(self) -> None:
        self.depth -= 1
        if self.depth == 1 and self.args_open:
            self.args_open = False
            self.expect = "next"
        elif self.depth == 0:
            self._end_scalar()
            self.done = True
        elif self.depth == 1:
            self.expect = "next"

    def _end_scalar(self) -> None:
        """A scalar arguments value ends at the ``,`` or ``}`` after it, which is not its own."""
        if self.args_open and self.depth <= 1:
            self.args.pop()
            self.args_open = False


class Parser:
    """Base of the parsers: numbered calls and the pieces each feed returns."""

    def __init__(self) -> None:
        self.calls = 0
        self.pieces: list[Piece] = []

    def feed(self, text: str) -> list[Piece]:
        """Pieces certain after ``text``."""
        for ch in text:
            self._char(ch)
        return self._take()

    def finish(self) -> list[Piece]:
        """Pieces held back until the end."""
        self._flush()
        return self._take()

    def _take(self) -> list[Piece]:
        pieces, self.pieces = self.pieces, []
        return _merged(pieces)

    def _char(self, ch: str) -> None:
        raise NotImplementedError

    def _flush(self) -> None:
        pass


def _merged(pieces: list[Piece]) -> list[Piece]:
    """Adjacent content or same-call arguments pieces joined."""
    out: list[Piece] = []
    for piece in pieces:
        last = out[-1] if out else None
        if isinstance(piece, Content) and isinstance(last, Content):
            out[-1] = Content(last.text + piece.text)
        elif isinstance(piece, Reasoning) and isinstance(last, Reasoning):
            out[-1] = Reasoning(last.text + piece.text)
        elif (
            isinstance(piece, Arguments)
            and isinstance(last, Arguments)
            and last.index == piece.index
        ):
            out[-1] = Arguments(piece.index, last.text + piece.text)
        else:
            out.append(piece)
    return out


class ContentParser(Parser):
    """Everything is content."""

    def feed(self, text: str) -> list[Piece]:
        return [Content(text)] if text else []


class ObjectCalls(Parser):
    """Tool-call objects, each read by a ``CallScanner``; what is between them is skipped."""

    def __init__(self, args_keys: tuple[str, ...] = ("arguments",)) -> None:
        super().__init__()
        self.args_keys = args_keys
        self.scanner: CallScanner | None = None
        self.sent_args = 0
        self.started = False
        self.raw: list[str] = []

    def _char(self, ch: str) -> None:
        self.raw.append(ch)
        if self.scanner is None:
            if ch != "{":
                return
            self.scanner, self.sent_args, self.started = CallScanner(self.args_keys), 0, False
        scanner = self.scanner
        scanner.feed(ch)
        self._emit(scanner)
        if scanner.done:
            self.scanner = None

    def _emit(self, scanner: CallScanner) -> None:
        if not self.started and scanner.name is not None:
            self.started = True
            self.pieces.append(CallStart(self.calls, call_id(), scanner.name))
            self.calls += 1
        if self.started and len(scanner.args) > self.sent_args:
            text = "".join(scanner.args[self.sent_args :])
            self.sent_args = len(scanner.args)
            self.pieces.append(Arguments(self.calls - 1, text))


class ArgumentsOnly(Parser):
    """The whole output is the arguments of one named function (leading whitespace dropped)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.started = False

    def _char(self, ch: str) -> None:
        if not self.started:
            if ch.isspace():
                return
            self.started = True
            self.pieces.append(CallStart(0, call_id(), self.name))
            self.calls = 1
        self.pieces.append(Arguments(0, ch))

    def _flush(self) -> None:
        if not self.started:
            self.pieces.append(CallStart(0, call_id(), self.name))
            self.pieces.append(Arguments(0, "{}"))


def partial_suffix(text: str, marker: str) -> int:
    """Where the longest suffix of ``text`` that could begin ``marker`` starts."""
    for start in range(max(0, len(text) - len(marker) + 1), len(text)):
        if marker.startswith(text[start:]):
            return start
    return len(text)


class CallFilter(Parser):
    """Another parser's pieces, only its first call kept (``parallel_tool_calls`` false) or its
    content dropped (a ``required`` answer, where the grammar lets only separators between
    calls)."""

    def __init__(self, inner: Parser, *, first_only: bool, content: bool) -> None:
        super().__init__()
        self.inner = inner
        self.first_only = first_only
        self.content = content

    def feed(self, text: str) -> list[Piece]:
        return self._kept(self.inner.feed(text))

    def finish(self) -> list[Piece]:
        return self._kept(self.inner.finish())

    def _kept(self, pieces: list[Piece]) -> list[Piece]:
        self.calls = min(1, self.inner.calls) if self.first_only else self.inner.calls
        return [
            p
            for p in pieces
            if isinstance(p, Reasoning)
            or (self.content if isinstance(p, Content) else not self.first_only or p.index == 0)
        ]
