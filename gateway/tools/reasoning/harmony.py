"""gpt-oss's harmony channels: ``analysis`` is reasoning, ``final`` the answer, ``commentary``
addressed ``to=functions.NAME`` a tool call.

The text is read with its special tokens (``<|channel|>``, ``<|message|>``, ``<|end|>``...):
the gateway's decoding keeps them (``SPECIAL_TOKENS``), a pipeline's postprocessing must.
``openai-harmony`` parses token ids with the o200k vocabulary, which it downloads on first use;
the gateway reads text and runs offline, so it reads the same grammar of headers and bodies here.
"""

from __future__ import annotations

import re
from typing import Any

from gateway.tools.parsing import (
    Arguments,
    CallStart,
    Parser,
    Piece,
    Reasoning,
    call_id,
    partial_suffix,
)
from gateway.tools.reasoning.base import PromptState, ReasoningFormat

MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
SPECIAL_TOKENS = ("<|channel|>", "<|message|>", "<|constrain|>", *ENDS)
"""What gpt-oss's tokenizer holds as special tokens and the channels are read by."""
HEADER_LIMIT = 512
"""A header longer than this is no header: the special tokens were not kept, all is content."""
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


class HarmonySplit(Parser):
    """Messages ``<|channel|>NAME[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY<|end|>``,
    each after ``<|start|>assistant``; bodies stream as they come."""

    def __init__(self, inner: Parser) -> None:
        super().__init__()
        self.inner = inner
        self.held = ""
        self.body: str | None = None
        """What the current message's body is: ``reasoning``, ``content``, ``call``; None
        while reading a header."""
        self.plain = False

    def feed(self, text: str) -> list[Piece]:
        self.held += text
        out: list[Piece] = []
        while self.held and self._step(out):
            pass
        self.calls = max(self.calls, self.inner.calls)
        return out

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        held, self.held = self.held, ""
        if self.body is None and held.strip():
            out.extend(self.inner.feed(held))
        elif self.body is not None and held:
            self._emit(held, out)
        out.extend(self.inner.finish())
        self.calls = max(self.calls, self.inner.calls)
        return out

    def _step(self, out: list[Piece]) -> bool:
        if self.plain:
            held, self.held = self.held, ""
            out.extend(self.inner.feed(held))
            return False
        if self.body is None:
            return self._header(out)
        ends = [(i, m) for m in ENDS if (i := self.held.find(m)) >= 0]
        if ends:
            index, marker = min(ends)
            self._emit(self.held[:index], out)
            self.body = None
            self.held = self.held[index + (0 if marker == "<|start|>" else len(marker)) :]
            return True
        cut = min(partial_suffix(self.held, marker) for marker in ENDS)
        self._emit(self.held[:cut], out)
        self.held = self.held[cut:]
        return False

    def _header(self, out: list[Piece]) -> bool:
        at = self.held.find(MESSAGE)
        if at < 0:
            if len(self.held) > HEADER_LIMIT:
                self.plain = True
                return True
            return False
        header, self.held = self.held[:at], self.held[at + len(MESSAGE) :]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        if recipient is not None and recipient.group(1).startswith("functions."):
            self.body = "call"
            name = recipient.group(1).removeprefix("functions.")
            out.append(CallStart(self.calls, call_id(), name))
            self.calls += 1
        elif channel is not None and channel.group(1) == "analysis":
            self.body = "reasoning"
        else:
            self.body = "content"
        return True

    def _emit(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        if self.body == "reasoning":
            out.append(Reasoning(text))
        elif self.body == "call":
            out.append(Arguments(self.calls - 1, text))
        else:
            out.extend(self.inner.feed(text))


class Harmony(ReasoningFormat):
    """gpt-oss's channels."""

    name = "harmony"
    special_tokens = SPECIAL_TOKENS

    def state(self, prompt: str) -> PromptState:
        return "free"

    def splitter(self, inner: Parser, state: PromptState, calls: tuple[str, ...] = ()) -> Parser:
        return HarmonySplit(inner)

    def guide_format(self, inner: dict[str, Any], state: PromptState) -> dict[str, Any]:
        thought = {
            "type": "tag",
            "begin": "<|channel|>analysis<|message|>",
            "content": {"type": "any_text"},
            "end": "<|end|><|start|>assistant",
        }
        final = {
            "type": "tag",
            "begin": "<|channel|>final<|message|>",
            "content": inner,
            "end": "",
        }
        return {
            "type": "or",
            "elements": [{"type": "sequence", "elements": [thought, final]}, final],
        }
