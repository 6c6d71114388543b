"""A conversation of Responses items as the chat messages its chat request runs on: function
calls folded into the assistant message that made them, their outputs as tool messages, earlier
reasoning given back with the answer it came before."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.errors import InvalidRequestError
from gateway.openai.responses.protocol import (
    FunctionCallItem,
    FunctionCallOutput,
    InputImage,
    Item,
    Message,
    Part,
    ReasoningItem,
    Refusal,
)


def chat_messages(
    instructions: str | None, history: Sequence[Item], items: Sequence[Item]
) -> list[dict[str, Any]]:
    """The conversation as chat messages: the instructions as the system message, every
    function call folded into the assistant message that made it, each output a tool message
    answering a call made before it (a 400 naming the output otherwise).

    A reasoning item goes back as the ``reasoning_content`` (and ``reasoning``) of the
    assistant message it came before, as vLLM gives it back: the chat template decides
    whether an earlier turn's reasoning is shown (Qwen3's keeps it only within the turn,
    between a function call and its output, where the model needs what it thought)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    calls: set[str] = set()
    thought: str | None = None
    for offset, item in enumerate([*history, *items]):
        index = offset - len(history)
        if thought is not None and not _answers(item):
            messages.append(_thinking({"role": "assistant", "content": ""}, thought))
            thought = None
        if isinstance(item, ReasoningItem):
            thought = "".join(part.text for part in item.content)
        elif isinstance(item, Message):
            said: dict[str, Any] = {"role": item.role, "content": _chat_content(item.content)}
            messages.append(_thinking(said, thought) if thought is not None else said)
            thought = None
        elif isinstance(item, FunctionCallItem):
            calls.add(item.call_id)
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if thought is None and last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                made: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
                messages.append(_thinking(made, thought) if thought is not None else made)
                thought = None
        elif isinstance(item, FunctionCallOutput):
            if item.call_id not in calls:
                raise InvalidRequestError(
                    f"No function_call with call_id "
                    f"{item.call_id!r} comes before this function_call_output.",
                    param=f"input[{index}].call_id",
                )
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    if thought is not None:
        messages.append(_thinking({"role": "assistant", "content": ""}, thought))
    return messages


def _answers(item: Item) -> bool:
    """Whether ``item`` is the assistant's answer a reasoning before it belongs to."""
    return isinstance(item, FunctionCallItem) or (
        isinstance(item, Message) and item.role == "assistant"
    )


def _thinking(message: dict[str, Any], thought: str) -> dict[str, Any]:
    """``message`` with the reasoning that came before it, under both names templates read."""
    return {**message, "reasoning_content": thought, "reasoning": thought}


def _chat_content(parts: list[Part]) -> str | list[dict[str, Any]]:
    if all(not isinstance(part, InputImage) for part in parts):
        return "".join(_text(part) for part in parts)
    return [
        {"type": "image_url", "image_url": {"url": part.image_url, "detail": part.detail}}
        if isinstance(part, InputImage)
        else {"type": "text", "text": _text(part)}
        for part in parts
    ]


def _text(part: Part) -> str:
    if isinstance(part, Refusal):
        return part.refusal
    return "" if isinstance(part, InputImage) else part.text
