"""Parsed pieces as OpenAI objects: a message's content and ``tool_calls``, streamed deltas."""

from __future__ import annotations

import msgspec
from msgspec import UNSET

from gateway.openai.protocol import (
    ChatDelta,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
)
from gateway.tools.output import OutputRules
from gateway.tools.parsing import Arguments, CallStart, Content, Folded, Parser, Piece, Reasoning


def finish_reason(reason: str, calls: int) -> str:
    """``tool_calls`` when an answer that stopped by itself made calls."""
    return "tool_calls" if calls and reason == "stop" else reason


def whole_message(output: OutputRules, text: str) -> Folded:
    """Content, reasoning and calls of a whole answer (see ``message_parts``)."""
    parser = output.parser()
    folded = Folded()
    folded.add(parser.feed(text))
    folded.add(parser.finish())
    return folded


def message_parts(folded: Folded) -> tuple[str | None, list[ToolCall]]:
    """Content (None when it is only the calls) and tool calls of a whole answer."""
    calls = [
        ToolCall(id=call.id, function=FunctionCall(name=call.name, arguments=call.arguments))
        for call in folded.calls
    ]
    content: str | None = folded.content
    if calls and not (content or "").strip():
        content = None
    return content, calls


class DeltaShaper:
    """One streamed choice: text deltas in, chat deltas with content and tool-call deltas out."""

    def __init__(self, output: OutputRules) -> None:
        self.parser: Parser = output.parser()
        self.reasoning = ""
        """The reasoning streamed so far, counted in ``usage`` at the end."""

    @property
    def calls(self) -> int:
        """Calls begun so far."""
        return self.parser.calls

    def delta(self, text: str) -> ChatDelta | None:
        """The delta for new text, or None while it is held back."""
        return self._delta(self.parser.feed(text))

    def end(self) -> ChatDelta | None:
        """The delta of what was held back until the end, if any."""
        return self._delta(self.parser.finish())

    def _delta(self, pieces: list[Piece]) -> ChatDelta | None:
        reasoning = "".join(piece.text for piece in pieces if isinstance(piece, Reasoning))
        self.reasoning += reasoning
        delta = _delta(pieces)
        if not reasoning:
            return delta
        base = delta or ChatDelta()
        return msgspec.structs.replace(base, reasoning_content=reasoning, reasoning=reasoning)


def _delta(pieces: list[Piece]) -> ChatDelta | None:
    content = "".join(piece.text for piece in pieces if isinstance(piece, Content))
    calls: list[ToolCallDelta] = []
    for piece in pieces:
        if isinstance(piece, CallStart):
            calls.append(
                ToolCallDelta(
                    index=piece.index,
                    id=piece.id,
                    type="function",
                    function=FunctionCallDelta(name=piece.name, arguments=""),
                )
            )
        elif isinstance(piece, Arguments):
            calls.append(
                ToolCallDelta(index=piece.index, function=FunctionCallDelta(arguments=piece.text))
            )
    if not content and not calls:
        return None
    return ChatDelta(content=content or UNSET, tool_calls=calls or UNSET)
