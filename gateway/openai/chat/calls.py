"""Parsed pieces as OpenAI objects: a message's content and ``tool_calls``, streamed deltas."""

from __future__ import annotations

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
    """One streamed choice: text deltas in, chat deltas with content and tool-call deltas out.

    Each tool-call piece is a delta of its own, as OpenAI streams them: a call's name (with
    ``arguments: ""``) comes alone, before its arguments, however much text one read brings, so
    a client reading chunk by chunk never sees one call twice in one chunk.
    """

    def __init__(self, output: OutputRules) -> None:
        self.parser: Parser = output.parser()
        self.reasoning = ""
        """The reasoning streamed so far, counted in ``usage`` at the end."""

    @property
    def calls(self) -> int:
        """Calls begun so far."""
        return self.parser.calls

    def deltas(self, text: str) -> list[ChatDelta]:
        """The deltas for new text, none while it is held back."""
        return self._deltas(self.parser.feed(text))

    def end(self) -> list[ChatDelta]:
        """The deltas of what was held back until the end."""
        return self._deltas(self.parser.finish())

    def _deltas(self, pieces: list[Piece]) -> list[ChatDelta]:
        out: list[ChatDelta] = []
        content: list[str] = []
        reasoning: list[str] = []
        for piece in pieces:
            if isinstance(piece, Content):
                content.append(piece.text)
            elif isinstance(piece, Reasoning):
                reasoning.append(piece.text)
            elif isinstance(piece, CallStart | Arguments):
                self._flush(out, content, reasoning)
                out.append(ChatDelta(tool_calls=[_call_delta(piece)]))
        self._flush(out, content, reasoning)
        return out

    def _flush(self, out: list[ChatDelta], content: list[str], reasoning: list[str]) -> None:
        """The text pieces read since the last call piece, as one delta."""
        text, thought = "".join(content), "".join(reasoning)
        content.clear()
        reasoning.clear()
        if not text and not thought:
            return
        self.reasoning += thought
        out.append(
            ChatDelta(
                content=text or UNSET,
                reasoning_content=thought or UNSET,
                reasoning=thought or UNSET,
            )
        )


def _call_delta(piece: CallStart | Arguments) -> ToolCallDelta:
    if isinstance(piece, CallStart):
        return ToolCallDelta(
            index=piece.index,
            id=piece.id,
            type="function",
            function=FunctionCallDelta(name=piece.name, arguments=""),
        )
    return ToolCallDelta(index=piece.index, function=FunctionCallDelta(arguments=piece.text))
