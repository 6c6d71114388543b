"""Parsers of calls that markers set apart from content: between an open and a close tag, or
at the very start of the output."""

from __future__ import annotations

from collections.abc import Callable

from gateway.tools.parsing import Content, ContentParser, ObjectCalls, Parser, partial_suffix


class TaggedCalls(Parser):
    """Content with calls between an open and a close marker (``<tool_call>...</tool_call>``).

    Text that might begin a marker is held back until it is certain; a call whose name never
    comes out is given back as content.
    """

    def __init__(
        self, open_tag: str, close_tag: str, inner: Callable[[], ObjectCalls] = ObjectCalls
    ) -> None:
        super().__init__()
        self.open_tag, self.close_tag = open_tag, close_tag
        self.inner_factory = inner
        self.inner: ObjectCalls | None = None
        self.held = ""

    def _char(self, ch: str) -> None:
        if self.inner is None:
            self.held += ch
            self._outside()
        else:
            self._inside(ch)

    def _outside(self) -> None:
        if self.held.startswith(self.open_tag):
            self.held = ""
            self.inner = self.inner_factory()
            self.inner.calls = self.calls
        elif not self.open_tag.startswith(self.held):
            cut = partial_suffix(self.held, self.open_tag)
            self.pieces.append(Content(self.held[:cut]))
            self.held = self.held[cut:]

    def _inside(self, ch: str) -> None:
        inner = self.inner
        assert inner is not None
        if inner.scanner is not None:
            self.pieces.extend(inner.feed(ch))
            return
        self.held += ch
        if self.held.endswith(self.close_tag):
            self._end_call()
        elif ch == "{":
            text, self.held = self.held, ""
            self.pieces.extend(inner.feed(text))

    def _end_call(self) -> None:
        inner = self.inner
        assert inner is not None
        self.pieces.extend(inner.finish())
        if inner.calls == self.calls:
            self.pieces.append(Content(self.open_tag + "".join(inner.raw) + self.held))
        self.calls = inner.calls
        self.inner, self.held = None, ""

    def _flush(self) -> None:
        if self.inner is not None:
            self._end_call()
        elif self.held:
            self.pieces.append(Content(self.held))
            self.held = ""


class LeadingCalls(Parser):
    """Calls only when the output opens with them (after an optional prefix, e.g. Llama 3's
    ``<|python_tag|>`` or Mistral's ``[TOOL_CALLS]``); otherwise it is all content."""

    def __init__(self, prefixes: tuple[str, ...], opener: str, calls: Callable[[], Parser]) -> None:
        super().__init__()
        self.prefixes, self.opener = prefixes, opener
        self.calls_factory = calls
        self.mode: Parser | None = None
        self.held = ""

    def _char(self, ch: str) -> None:
        if self.mode is not None:
            self._forward(ch)
            return
        self.held += ch
        head = self.held.lstrip()
        if not head:
            return
        for prefix in self.prefixes:
            if head.startswith(prefix):
                self._enter(self.calls_factory(), head[len(prefix) :])
                return
            if prefix.startswith(head):
                return
        if head.startswith(self.opener):
            self._enter(self.calls_factory(), head)
        elif not self.opener.startswith(head):
            self._enter(ContentParser(), self.held)

    def _enter(self, mode: Parser, text: str) -> None:
        self.mode, self.held = mode, ""
        self._forward(text)

    def _forward(self, text: str) -> None:
        assert self.mode is not None
        self.pieces.extend(self.mode.feed(text))
        self.calls = self.mode.calls

    def _flush(self) -> None:
        if self.mode is None and self.held:
            self.pieces.append(Content(self.held))
        elif self.mode is not None:
            self.pieces.extend(self.mode.finish())
            self.calls = self.mode.calls
