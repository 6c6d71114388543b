"""Chat's answers as responses: a whole chat completion as the response object, and a stream of
chat chunks as the response's events. ReasoningItem (chat's ``reasoning_content``) becomes a
``reasoning`` item, content a ``message``, each tool call a ``function_call``."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.errors import APIError, to_api_error
from gateway.ids import random_hex
from gateway.openai.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ToolCallDelta,
    Usage,
)
from gateway.openai.responses.events import (
    ArgumentsDelta,
    ArgumentsDone,
    ItemAdded,
    ItemDone,
    OutputTextDelta,
    PartAdded,
    PartDone,
    ReasoningDelta,
    ReasoningDone,
    ResponseCompleted,
    ResponseCreated,
    ResponseEvent,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    TextDone,
)
from gateway.openai.responses.protocol import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    Message,
    OutputItem,
    OutputText,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    ResponseErrorBody,
    ResponseObject,
    ResponseUsage,
)

Keep = Callable[[ResponseObject], Awaitable[None]]
"""Stores a finished response (nothing for ``store: false``)."""


def item_id(prefix: str) -> str:
    """A fresh id of an output item: ``msg_...``, ``fc_...``, ``rs_...``."""
    return f"{prefix}_{random_hex(16)}"


def response_usage(usage: Usage | None) -> ResponseUsage | None:
    """Chat's usage in the Responses API's words; reasoning tokens where chat counts them."""
    if usage is None:
        return None
    cached = usage.prompt_tokens_details
    details = usage.completion_tokens_details
    reasoning = 0 if isinstance(details, msgspec.UnsetType) else details.reasoning_tokens
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=0 if isinstance(cached, msgspec.UnsetType) else cached.cached_tokens
        ),
        output_tokens=usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning),
        total_tokens=usage.total_tokens,
    )


def finished(
    draft: ResponseObject, output: list[OutputItem], usage: Usage | None, reason: str | None
) -> ResponseObject:
    """The draft response with its output, ended for ``reason`` (chat's finish reason)."""
    incomplete = reason == "length"
    return msgspec.structs.replace(
        draft,
        status="incomplete" if incomplete else "completed",
        incomplete_details=IncompleteDetails("max_output_tokens") if incomplete else None,
        output=output,
        usage=response_usage(usage),
    )


def _reasoning_of(container: AssistantMessage | ChatDelta) -> str | None:
    """Chat's ``reasoning_content`` of a message or delta, where the model reasoned."""
    text = container.reasoning_content
    return text if isinstance(text, str) and text else None


def whole_response(draft: ResponseObject, completion: ChatCompletion) -> ResponseObject:
    """A whole chat completion (one choice) as the finished response."""
    choice = completion.choices[0]
    message = choice.message
    status = "incomplete" if choice.finish_reason == "length" else "completed"
    output: list[OutputItem] = []
    if (reasoning := _reasoning_of(message)) is not None:
        output.append(ReasoningItem(id=item_id("rs"), content=[ReasoningText(reasoning)]))
    calls = message.tool_calls if isinstance(message.tool_calls, list) else []
    if message.content or not calls:
        text = OutputText(text=message.content or "")
        output.append(Message(id=item_id("msg"), status=status, role="assistant", content=[text]))
    output.extend(
        FunctionCallItem(
            id=item_id("fc"),
            call_id=call.id,
            name=call.function.name,
            arguments=call.function.arguments,
        )
        for call in calls
    )
    return finished(draft, output, completion.usage, choice.finish_reason)


@dataclass(slots=True)
class _OpenItem:
    """The output item being streamed."""

    kind: str
    index: int
    id: str
    texts: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""


class EventWriter:
    """One streamed response: chat chunks in, the response's events out, numbered."""

    def __init__(self, draft: ResponseObject) -> None:
        self.draft = draft
        self.output: list[OutputItem] = []
        self.sequence = 0
        self.open: _OpenItem | None = None
        self.calls: dict[int, _OpenItem] = {}
        self.usage: Usage | None = None
        self.reason: str | None = None

    def _number(self) -> int:
        self.sequence += 1
        return self.sequence - 1

    def opening(self) -> list[ResponseEvent]:
        """``response.created`` and ``response.in_progress``."""
        return [
            ResponseCreated(sequence_number=self._number(), response=self.draft),
            ResponseInProgress(sequence_number=self._number(), response=self.draft),
        ]

    def chunks(self, batch: list[ChatCompletionChunk]) -> list[ResponseEvent]:
        """The events a batch of chat chunks makes."""
        events: list[ResponseEvent] = []
        for chunk in batch:
            if isinstance(chunk.usage, Usage):
                self.usage = chunk.usage
            for choice in chunk.choices:
                delta = choice.delta
                if (reasoning := _reasoning_of(delta)) is not None:
                    self._text("reasoning", reasoning, events)
                if isinstance(delta.content, str) and delta.content:
                    self._text("message", delta.content, events)
                if isinstance(delta.tool_calls, list):
                    for call in delta.tool_calls:
                        self._call(call, events)
                if choice.finish_reason is not None:
                    self.reason = choice.finish_reason
                    self._close(events)
        return events

    def ending(self) -> tuple[ResponseObject, list[ResponseEvent]]:
        """The finished response and its closing events (an empty message for an answer
        without output); its lifecycle event comes once it is stored (``last``)."""
        events: list[ResponseEvent] = []
        self._close(events)
        if not self.output:
            self._text("message", "", events)
            self._close(events)
        return finished(self.draft, self.output, self.usage, self.reason), events

    def last(self, response: ResponseObject) -> ResponseEvent:
        """``response.completed``, or ``response.incomplete`` for one cut short."""
        kind = ResponseIncomplete if response.status == "incomplete" else ResponseCompleted
        return kind(sequence_number=self._number(), response=response)

    def failure(self, error: APIError) -> tuple[ResponseObject, ResponseEvent]:
        """The failed response and its ``response.failed`` event, as OpenAI ends a stream that
        fails: the items already done as they were, the one being written left unfinished
        (``incomplete``, no done events), ``error`` with the code of OpenAI's that fits."""
        output = list(self.output)
        if (current := self.open) is not None:
            output.append(_unfinished(current))
        response = msgspec.structs.replace(
            self.draft,
            status="failed",
            error=ResponseErrorBody(code=_failure_code(error), message=error.message),
            output=output,
            usage=response_usage(self.usage),
        )
        return response, ResponseFailed(sequence_number=self._number(), response=response)

    def _text(self, kind: str, text: str, events: list[ResponseEvent]) -> None:
        current = self.open
        if current is None or current.kind != kind:
            current = self._start(kind, events)
        current.texts.append(text)
        if not text:
            return
        if kind == "message":
            events.append(
                OutputTextDelta(
                    sequence_number=self._number(),
                    item_id=current.id,
                    output_index=current.index,
                    content_index=0,
                    delta=text,
                )
            )
        else:
            events.append(
                ReasoningDelta(
                    sequence_number=self._number(),
                    item_id=current.id,
                    output_index=current.index,
                    content_index=0,
                    delta=text,
                )
            )

    def _start(self, kind: str, events: list[ResponseEvent]) -> _OpenItem:
        self._close(events)
        index = len(self.output)
        current = _OpenItem(kind, index, item_id("msg" if kind == "message" else "rs"))
        self.open = current
        item: OutputItem
        part: OutputText | ReasoningText
        if kind == "message":
            item = Message(id=current.id, status="in_progress", role="assistant", content=[])
            part = OutputText(text="")
        else:
            item = ReasoningItem(id=current.id, status="in_progress")
            part = ReasoningText("")
        events.append(ItemAdded(sequence_number=self._number(), output_index=index, item=item))
        events.append(
            PartAdded(
                sequence_number=self._number(),
                item_id=current.id,
                output_index=index,
                content_index=0,
                part=part,
            )
        )
        return current

    def _call(self, call: ToolCallDelta, events: list[ResponseEvent]) -> None:
        arguments = call.function.arguments
        if isinstance(call.id, str):
            self._close(events)
            name = call.function.name if isinstance(call.function.name, str) else ""
            current = _OpenItem("call", len(self.output), item_id("fc"), call_id=call.id, name=name)
            self.open = current
            self.calls[call.index] = current
            item = FunctionCallItem(
                id=current.id, status="in_progress", call_id=call.id, name=name, arguments=""
            )
            events.append(
                ItemAdded(sequence_number=self._number(), output_index=current.index, item=item)
            )
        current = self.calls[call.index]
        if isinstance(arguments, str) and arguments:
            current.texts.append(arguments)
            events.append(
                ArgumentsDelta(
                    sequence_number=self._number(),
                    item_id=current.id,
                    output_index=current.index,
                    delta=arguments,
                )
            )

    def _close(self, events: list[ResponseEvent]) -> None:
        current = self.open
        if current is None:
            return
        self.open = None
        text = "".join(current.texts)
        number = self._number
        where: dict[str, Any] = {"item_id": current.id, "output_index": current.index}
        item: OutputItem
        if current.kind == "call":
            events.append(
                ArgumentsDone(sequence_number=number(), **where, name=current.name, arguments=text)
            )
            item = FunctionCallItem(
                id=current.id, call_id=current.call_id, name=current.name, arguments=text
            )
        elif current.kind == "message":
            part = OutputText(text=text)
            events.append(TextDone(sequence_number=number(), **where, content_index=0, text=text))
            events.append(PartDone(sequence_number=number(), **where, content_index=0, part=part))
            status = "incomplete" if self.reason == "length" else "completed"
            item = Message(id=current.id, status=status, role="assistant", content=[part])
        else:
            reasoning = ReasoningText(text)
            events.append(
                ReasoningDone(sequence_number=number(), **where, content_index=0, text=text)
            )
            events.append(
                PartDone(sequence_number=number(), **where, content_index=0, part=reasoning)
            )
            item = ReasoningItem(id=current.id, content=[reasoning])
        self.output.append(item)
        events.append(ItemDone(sequence_number=number(), output_index=current.index, item=item))


def _unfinished(current: _OpenItem) -> OutputItem:
    """The item being streamed when the response failed, with what it had."""
    text = "".join(current.texts)
    if current.kind == "call":
        return FunctionCallItem(
            id=current.id,
            status="incomplete",
            call_id=current.call_id,
            name=current.name,
            arguments=text,
        )
    if current.kind == "message":
        part = OutputText(text=text)
        return Message(id=current.id, status="incomplete", role="assistant", content=[part])
    return ReasoningItem(id=current.id, status="incomplete", content=[ReasoningText(text)])


def _failure_code(error: APIError) -> str:
    """The code of OpenAI's ``ResponseError`` for a failure: the SDK's type allows a closed
    list of codes, so the gateway's own code (``timeout``...) is told by the message."""
    if error.status_code == 429:
        return "rate_limit_exceeded"
    if error.status_code == 400:
        return "invalid_prompt"
    return "server_error"


async def response_events(
    draft: ResponseObject,
    chunks: AsyncGenerator[list[ChatCompletionChunk], None],
    keep: Keep,
) -> AsyncGenerator[list[ResponseEvent], None]:
    """A streamed chat as the response's events: nothing until chat's first chunks came (so
    that a request failing before any output gets its HTTP status), the finished response
    kept before its last event. A failure once the stream began ends it with
    ``response.failed``, the failed response kept, as the SDK and the Agents SDK expect of
    OpenAI rather than chat's in-band ``{"error": ...}``."""
    writer = EventWriter(draft)
    try:
        first = await anext(chunks, None)
        if first is None:
            return
        yield [*writer.opening(), *writer.chunks(first)]
        try:
            async for batch in chunks:
                events = writer.chunks(batch)
                if events:
                    yield events
        except Exception as exc:
            failed, event = writer.failure(to_api_error(exc))
            await keep(failed)
            yield [event]
            return
    finally:
        await chunks.aclose()
    response, closing = writer.ending()
    await keep(response)
    yield [*closing, writer.last(response)]


def draft_now(**fields: Any) -> ResponseObject:
    """A response being made now, ``in_progress`` and without output yet."""
    return ResponseObject(created_at=int(time.time()), status="in_progress", output=[], **fields)
