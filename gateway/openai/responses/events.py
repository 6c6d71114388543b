"""The streamed response's events, as the openai SDK's ``responses.stream()`` helper and the
Agents SDK read them: every item added, its parts and deltas, done, then the response's last
lifecycle event; ``sequence_number`` counts every event from 0."""

from __future__ import annotations

from msgspec import Struct

from gateway.openai.responses.protocol import OutputItem, OutputText, ReasoningText, ResponseObject


class ResponseEvent(Struct, frozen=True, kw_only=True, tag_field="type"):
    """One server-sent event of a streamed response."""

    sequence_number: int


class ResponseCreated(ResponseEvent, frozen=True, kw_only=True, tag="response.created"):
    """The response exists (``in_progress``)."""

    response: ResponseObject


class ResponseInProgress(ResponseEvent, frozen=True, kw_only=True, tag="response.in_progress"):
    """The response is being generated."""

    response: ResponseObject


class ResponseCompleted(ResponseEvent, frozen=True, kw_only=True, tag="response.completed"):
    """The response ended by itself."""

    response: ResponseObject


class ResponseIncomplete(ResponseEvent, frozen=True, kw_only=True, tag="response.incomplete"):
    """The response stopped at ``max_output_tokens`` (or the context's end)."""

    response: ResponseObject


class ResponseFailed(ResponseEvent, frozen=True, kw_only=True, tag="response.failed"):
    """The response failed after its stream began; its ``error`` says why."""

    response: ResponseObject


class ItemAdded(ResponseEvent, frozen=True, kw_only=True, tag="response.output_item.added"):
    """An output item begins (``in_progress``)."""

    output_index: int
    item: OutputItem


class ItemDone(ResponseEvent, frozen=True, kw_only=True, tag="response.output_item.done"):
    """An output item is whole."""

    output_index: int
    item: OutputItem


class PartAdded(ResponseEvent, frozen=True, kw_only=True, tag="response.content_part.added"):
    """A content part of an item begins, empty."""

    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText


class PartDone(ResponseEvent, frozen=True, kw_only=True, tag="response.content_part.done"):
    """A content part is whole."""

    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText


class OutputTextDelta(ResponseEvent, frozen=True, kw_only=True, tag="response.output_text.delta"):
    """New text of a message."""

    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[object] = []


class TextDone(ResponseEvent, frozen=True, kw_only=True, tag="response.output_text.done"):
    """A message's whole text."""

    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[object] = []


class ReasoningDelta(ResponseEvent, frozen=True, kw_only=True, tag="response.reasoning_text.delta"):
    """New text of the model's reasoning."""

    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningDone(ResponseEvent, frozen=True, kw_only=True, tag="response.reasoning_text.done"):
    """The reasoning's whole text."""

    item_id: str
    output_index: int
    content_index: int
    text: str


class ArgumentsDelta(
    ResponseEvent, frozen=True, kw_only=True, tag="response.function_call_arguments.delta"
):
    """New text of a function call's JSON arguments."""

    item_id: str
    output_index: int
    delta: str


class ArgumentsDone(
    ResponseEvent, frozen=True, kw_only=True, tag="response.function_call_arguments.done"
):
    """A function call's whole arguments."""

    item_id: str
    output_index: int
    name: str
    arguments: str
