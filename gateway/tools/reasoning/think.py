"""The ``<think>…</think>`` family (DeepSeek-R1, Qwen3, SmolLM3, GLM 4.5+): reasoning between two
tags at the start of the answer, or from the start when the chat template opened the tag in the
prompt."""

from __future__ import annotations

from typing import Any

from gateway.tools.parsing import Content, Parser, Piece, Reasoning, partial_suffix
from gateway.tools.reasoning.base import PromptState, ReasoningFormat

START, END = "<think>", "</think>"


class ThinkSplit(Parser):
    """Reasoning between ``<think>`` and ``</think>``, the rest to ``inner``.

    Tags split over several deltas are held back until they are certain; the whitespace around
    the reasoning (the newlines the models write inside and after the tags) is dropped. A tool
    call's opening (``calls``) ends the reasoning too, and begins the answer: Qwen3.5 may call a
    tool without closing its reasoning.
    """

    def __init__(self, inner: Parser, state: PromptState, calls: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.inner = inner
        self.ends = (END, *calls)
        self.mode = {"open": "reasoning", "closed": "after", "free": "start"}[state]
        self.held = ""
        self.began = False

    def feed(self, text: str) -> list[Piece]:
        self.held += text
        pieces: list[Piece] = []
        while self.held and self._step(pieces):
            pass
        self.calls = self.inner.calls
        return _joined(pieces)

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        held, self.held = self.held, ""
        if self.mode == "reasoning" and held.strip():
            pieces.append(Reasoning(held.rstrip()))
        elif self.mode in ("start", "content") and held:
            pieces.extend(self.inner.feed(held))
        pieces.extend(self.inner.finish())
        self.calls = self.inner.calls
        return _joined(pieces)

    def _step(self, pieces: list[Piece]) -> bool:
        """Take what ``held`` settles; False when the rest must wait for more text."""
        if self.mode == "start":
            head = self.held.lstrip()
            if head.startswith(START):
                self.mode, self.held = "reasoning", head[len(START) :]
                return True
            if not head or START.startswith(head):
                return False
            self.mode = "content"
        if self.mode == "reasoning":
            return self._reasoning(pieces)
        if self.mode == "after":
            self.held = self.held.lstrip()
            if not self.held:
                return False
            self.mode = "content"
        held, self.held = self.held, ""
        pieces.extend(self.inner.feed(held))
        return False

    def _reasoning(self, pieces: list[Piece]) -> bool:
        if not self.began:
            self.held = self.held.lstrip()
            if not self.held:
                return False
        found = [(i, marker) for marker in self.ends if (i := self.held.find(marker)) >= 0]
        if found:
            end, marker = min(found)
            text = self.held[:end].rstrip()
            if text:
                pieces.append(Reasoning(text))
            skip = len(END) if marker == END else 0
            self.mode, self.held = "after", self.held[end + skip :]
            return True
        # Whitespace is held with a partial tag: it is dropped if the tag comes next.
        cut = min(partial_suffix(self.held, marker) for marker in self.ends)
        kept = len(self.held[:cut].rstrip())
        if kept:
            pieces.append(Reasoning(self.held[:kept]))
            self.began = True
        self.held = self.held[kept:]
        return False


def _joined(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for piece in pieces:
        last = out[-1] if out else None
        if isinstance(piece, Reasoning) and isinstance(last, Reasoning):
            out[-1] = Reasoning(last.text + piece.text)
        elif isinstance(piece, Content) and isinstance(last, Content):
            out[-1] = Content(last.text + piece.text)
        else:
            out.append(piece)
    return out


class Think(ReasoningFormat):
    """``<think>reasoning</think>answer``."""

    name = "think"
    special_tokens = (START, END)

    def state(self, prompt: str) -> PromptState:
        tail = prompt.rstrip()
        if tail.endswith(START):
            return "open"
        if tail.endswith(END):
            # Qwen3 and SmolLM3 close an empty reasoning in the prompt when thinking is off.
            return "closed"
        return "free"

    def splitter(self, inner: Parser, state: PromptState, calls: tuple[str, ...] = ()) -> Parser:
        return ThinkSplit(inner, state, calls)

    def guide_format(self, inner: dict[str, Any], state: PromptState) -> dict[str, Any]:
        thought = {"type": "tag", "begin": START, "content": {"type": "any_text"}, "end": END}
        if state == "open":
            thought["begin"] = ""
        answer = {"type": "sequence", "elements": [thought, WHITESPACE, inner]}
        if state == "open":
            return answer
        return {"type": "or", "elements": [answer, inner]}


WHITESPACE = {"type": "regex", "pattern": "[ \\n]*"}
"""What the models write between the reasoning's end and the guided answer."""
