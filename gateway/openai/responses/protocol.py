"""Responses API wire schemas: the request of ``POST /v1/responses``, the items of a
conversation, the response object and the stored record. Field names and shapes follow the
openai SDK's ``openai.types.responses``."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, Struct, UnsetType

from gateway.openai.protocol import NonNegativeInt, PositiveInt, SamplingFields

# Requests: one loose struct per kind of part, so that each refusal can name its place
# (``input[2].call_id``); the translation checks what each item type needs.


class InputPart(Struct, frozen=True, kw_only=True):
    """One part of a message's ``content``: ``input_text``, ``input_image``, ``output_text``
    (an assistant's earlier words), ``refusal``."""

    type: str
    text: str | UnsetType = UNSET
    image_url: str | UnsetType | None = UNSET
    detail: str | UnsetType | None = UNSET
    file_id: str | UnsetType | None = UNSET
    refusal: str | UnsetType = UNSET


class InputItem(Struct, frozen=True, kw_only=True):
    """One entry of ``input``: a message (``type`` may be left out), a ``function_call`` the
    model made, the ``function_call_output`` answering it, or an earlier ``reasoning`` item."""

    type: str = "message"
    id: str | UnsetType | None = UNSET
    role: str | UnsetType = UNSET
    content: str | list[InputPart] | UnsetType | None = UNSET
    call_id: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET
    output: str | list[InputPart] | UnsetType = UNSET
    status: str | UnsetType | None = UNSET


class FunctionTool(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``tools[i]``: a function the model may call (the only kind the gateway runs)."""

    type: str
    name: str | UnsetType = UNSET
    description: str | UnsetType | None = UNSET
    parameters: dict[str, Any] | UnsetType | None = UNSET
    strict: bool | UnsetType | None = UNSET


class ToolChoiceObject(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``tool_choice: {"type": "function", "name": ...}``."""

    type: str
    name: str | UnsetType = UNSET


class TextFormat(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``text.format``: ``text``, ``json_object`` or ``json_schema``."""

    type: str
    name: str | UnsetType = UNSET
    schema: dict[str, Any] | UnsetType | None = UNSET
    description: str | UnsetType | None = UNSET
    strict: bool | UnsetType | None = UNSET


class TextConfig(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``text``: the format of the answer."""

    format: TextFormat | UnsetType | None = UNSET
    verbosity: str | UnsetType | None = UNSET


class ReasoningConfig(Struct, frozen=True, kw_only=True):
    """``reasoning``: how hard a reasoning model thinks, and whether to summarize it."""

    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(SamplingFields, frozen=True, kw_only=True):
    """Body of ``POST /v1/responses``: the Responses fields, and chat's sampling extras."""

    input: str | list[InputItem] | UnsetType = UNSET
    instructions: str | UnsetType | None = UNSET
    tools: list[FunctionTool] | UnsetType | None = UNSET
    tool_choice: str | ToolChoiceObject | UnsetType | None = UNSET
    parallel_tool_calls: bool | UnsetType | None = UNSET
    text: TextConfig | UnsetType | None = UNSET
    max_output_tokens: PositiveInt | UnsetType | None = UNSET
    metadata: dict[str, str] | UnsetType | None = UNSET
    store: bool | UnsetType | None = UNSET
    previous_response_id: str | UnsetType | None = UNSET
    reasoning: ReasoningConfig | UnsetType | None = UNSET
    truncation: str | UnsetType | None = UNSET
    top_logprobs: NonNegativeInt | UnsetType | None = UNSET
    # Fields the gateway cannot honour: each is refused by name when it asks for something.
    background: bool | UnsetType | None = UNSET
    conversation: Any | UnsetType = UNSET
    prompt: Any | UnsetType = UNSET
    include: list[str] | UnsetType | None = UNSET
    max_tool_calls: int | UnsetType | None = UNSET


# Items as the gateway gives and keeps them: tagged by ``type``.


class InputText(Struct, frozen=True, tag="input_text", tag_field="type"):
    """Text a user, system or developer wrote."""

    text: str


class InputImage(Struct, frozen=True, kw_only=True, tag="input_image", tag_field="type"):
    """An image of a user's message."""

    image_url: str | None = None
    detail: str = "auto"


class OutputText(Struct, frozen=True, kw_only=True, tag="output_text", tag_field="type"):
    """Text the model wrote."""

    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class Refusal(Struct, frozen=True, tag="refusal", tag_field="type"):
    """A refusal the model wrote (kept as it came in an earlier turn)."""

    refusal: str


Part = InputText | InputImage | OutputText | Refusal


class Message(Struct, frozen=True, kw_only=True, tag="message", tag_field="type"):
    """A message of the conversation: the caller's input, or the model's output."""

    id: str
    status: str = "completed"
    role: str
    content: list[Part]


class FunctionCallItem(Struct, frozen=True, kw_only=True, tag="function_call", tag_field="type"):
    """A call of one of the request's functions, made by the model."""

    id: str
    status: str = "completed"
    call_id: str
    name: str
    arguments: str


class FunctionCallOutput(
    Struct, frozen=True, kw_only=True, tag="function_call_output", tag_field="type"
):
    """What the caller's function answered to a call."""

    id: str
    status: str = "completed"
    call_id: str
    output: str


class ReasoningText(Struct, frozen=True, tag="reasoning_text", tag_field="type"):
    """The text of a model's reasoning."""

    text: str


class ReasoningItem(Struct, frozen=True, kw_only=True, tag="reasoning", tag_field="type"):
    """What a reasoning model thought before it answered."""

    id: str
    status: str = "completed"
    summary: list[Any] = []
    content: list[ReasoningText] = []


Item = Message | FunctionCallItem | FunctionCallOutput | ReasoningItem
OutputItem = Message | FunctionCallItem | ReasoningItem


# The response object.


class InputTokensDetails(Struct, frozen=True, kw_only=True):
    """``usage.input_tokens_details``: the prompt tokens the engine found in its KV cache;
    what it wrote there the engine does not report (0)."""

    cache_write_tokens: int = 0
    cached_tokens: int = 0


class OutputTokensDetails(Struct, frozen=True):
    """``usage.output_tokens_details``."""

    reasoning_tokens: int = 0


class ResponseUsage(Struct, frozen=True, kw_only=True):
    """Token counts of a response."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(Struct, frozen=True):
    """Why a response stopped early."""

    reason: str


class ResponseErrorBody(Struct, frozen=True):
    """``error`` of a failed response."""

    code: str
    message: str


class ResponseText(Struct, frozen=True, kw_only=True):
    """``text`` of the response object: the format the answer was asked in."""

    format: dict[str, Any]


class ResponseReasoning(Struct, frozen=True, kw_only=True):
    """``reasoning`` of the response object."""

    effort: str | None = None
    summary: str | None = None


Status = Literal["in_progress", "completed", "incomplete", "failed"]


class ResponseObject(Struct, frozen=True, kw_only=True):
    """A response, as answered, streamed in its lifecycle events, and stored."""

    id: str
    object: str = "response"
    created_at: int
    status: Status
    error: ResponseErrorBody | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: ResponseReasoning = ResponseReasoning()
    store: bool = True
    temperature: float | None = None
    text: ResponseText
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[FunctionTool] = []
    top_p: float | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = {}
    background: bool = False


class StoredResponse(Struct, frozen=True, kw_only=True):
    """What the store keeps of a response: it, this turn's input, and the conversation before
    it (earlier inputs and outputs, instructions apart), so one read continues it."""

    response: ResponseObject
    input: list[Item]
    history: list[Item]


class InputItemList(Struct, frozen=True, kw_only=True):
    """Answer of ``GET /v1/responses/{id}/input_items``."""

    object: str = "list"
    data: list[Item]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedResponse(Struct, frozen=True, kw_only=True):
    """Answer of ``DELETE /v1/responses/{id}``."""

    id: str
    object: str = "response"
    deleted: bool = True
