"""A Responses request as the chat request it runs as: its input as items, its tools, tool
choice and text format as chat's, chat's refusals named in the request's own words; what the
gateway cannot honour refused with a 400 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import msgspec

from gateway.errors import InvalidRequestError
from gateway.ids import random_hex
from gateway.openai.protocol import ChatCompletionRequest
from gateway.openai.responses.protocol import (
    FunctionCallItem,
    FunctionCallOutput,
    InputImage,
    InputItem,
    InputPart,
    InputText,
    Item,
    Message,
    OutputText,
    Part,
    ReasoningItem,
    ReasoningText,
    Refusal,
    ResponsesRequest,
    ToolChoiceObject,
)
from gateway.openai.sampling import given

MESSAGE_ROLES = ("user", "system", "developer", "assistant")
TOOL_CHOICES = ("auto", "none", "required")
TRUNCATIONS = ("disabled",)
MAX_METADATA = 16
MAX_METADATA_VALUE = 512
_CHAT_ONLY = {
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
}
"""Chat's fields that the Responses API names otherwise."""
_RESPONSES_PARAMS = {
    "reasoning_effort": "reasoning.effort",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
}
"""The request's fields under the names chat's checks give them."""


@contextmanager
def responses_params() -> Iterator[None]:
    """Chat's refusals of a response's chat request in the words of the caller's request: a
    400 names ``reasoning.effort``, not the chat field it ran as."""
    try:
        yield
    except InvalidRequestError as exc:
        ours = _RESPONSES_PARAMS.get(exc.param or "")
        if ours is None:
            raise
        message = exc.message.replace(str(exc.param), ours)
        raise type(exc)(message, param=ours, code=exc.code) from None


def refuse_unsupported(request: ResponsesRequest) -> None:
    """A 400 naming the first field asking for what the gateway cannot do."""
    _refuse_service_features(request)
    _refuse_sampling(request)
    _check_metadata(given(request.metadata) or {})


def _refuse_service_features(request: ResponsesRequest) -> None:
    """What OpenAI's service keeps or runs for its callers and the gateway does not."""
    if given(request.background):
        _refuse(
            "background",
            "Background responses are not supported: send the request and "
            "read its answer (or stream it).",
        )
    if given(request.conversation) is not None:
        _refuse(
            "conversation",
            "Conversation objects are not supported: continue a "
            "conversation with previous_response_id.",
        )
    if given(request.prompt) is not None:
        _refuse("prompt", "Stored prompt templates are not supported: send instructions and input.")
    for index, value in enumerate(given(request.include) or ()):
        _refuse(f"include[{index}]", f"include value {value!r} cannot be produced by this gateway.")
    if given(request.max_tool_calls) is not None:
        _refuse(
            "max_tool_calls",
            "max_tool_calls is not supported: set parallel_tool_calls "
            "to false for one call per response.",
        )


def _refuse_sampling(request: ResponsesRequest) -> None:
    """What a response cannot ask of the engine, and chat's names for Responses fields."""
    if (given(request.n) or 1) > 1:
        _refuse("n", "A response has one answer: n must be 1.")
    if given(request.use_beam_search):
        _refuse("use_beam_search", "Beam search is not supported for responses.")
    if given(request.top_logprobs):
        _refuse(
            "top_logprobs",
            "top_logprobs > 0 is not supported: TensorRT-LLM through "
            "Triton returns only the log probabilities of the sampled tokens.",
        )
    truncation = given(request.truncation)
    if truncation is not None and truncation not in TRUNCATIONS:
        _refuse(
            "truncation",
            f"truncation {truncation!r} is not supported: a conversation "
            "longer than the context is refused (truncation 'disabled').",
        )
    for field, instead in _CHAT_ONLY.items():
        if given(getattr(request, field)) is not None:
            _refuse(field, f"{field} is a chat completions field; a response takes {instead}.")
    reasoning = given(request.reasoning)
    if reasoning is not None and reasoning.summary not in (None, "auto"):
        _refuse(
            "reasoning.summary",
            "ReasoningItem summaries are not produced by this gateway: "
            "reasoning comes as the model wrote it (reasoning_text).",
        )


def _refuse(param: str, message: str) -> NoReturn:
    raise InvalidRequestError(message, param=param)


def _check_metadata(metadata: dict[str, str]) -> None:
    if len(metadata) > MAX_METADATA:
        _refuse("metadata", f"metadata holds at most {MAX_METADATA} keys.")
    for key, value in metadata.items():
        if len(key) > 64 or len(value) > MAX_METADATA_VALUE:
            _refuse(
                f"metadata.{key}",
                f"metadata keys hold at most 64 characters and values {MAX_METADATA_VALUE}.",
            )


def input_items(request: ResponsesRequest) -> list[Item]:
    """The request's ``input`` as the items it is kept as, each given an id."""
    given_input = request.input
    if isinstance(given_input, str):
        return [Message(id=_id("msg"), role="user", content=[InputText(given_input)])]
    if isinstance(given_input, msgspec.UnsetType) or not given_input:
        _refuse("input", "A response needs input: a string or a list of items.")
    return [_item(item, f"input[{index}]") for index, item in enumerate(given_input)]


def _id(prefix: str) -> str:
    return f"{prefix}_{random_hex(16)}"


def _item(item: InputItem, param: str) -> Item:
    kind = item.type
    if kind == "message":
        role = given(item.role)
        if role not in MESSAGE_ROLES:
            _refuse(f"{param}.role", f"A message's role is one of {', '.join(MESSAGE_ROLES)}.")
        return Message(
            id=given(item.id) or _id("msg"), role=role, content=_parts(item.content, param, role)
        )
    if kind == "function_call":
        call_id, name = (
            _required(item.call_id, param, "call_id"),
            _required(item.name, param, "name"),
        )
        arguments = given(item.arguments)
        if arguments is None:
            _refuse(f"{param}.arguments", "A function_call item needs its arguments.")
        return FunctionCallItem(
            id=given(item.id) or _id("fc"), call_id=call_id, name=name, arguments=arguments
        )
    if kind == "function_call_output":
        call_id = _required(item.call_id, param, "call_id")
        output = item.output
        if isinstance(output, msgspec.UnsetType):
            _refuse(f"{param}.output", "A function_call_output item needs its output.")
        text = output if isinstance(output, str) else _joined(output, f"{param}.output")
        return FunctionCallOutput(id=given(item.id) or _id("fco"), call_id=call_id, output=text)
    if kind == "reasoning":
        texts = [part.text for part in _part_list(item.content) if isinstance(part.text, str)]
        return ReasoningItem(
            id=given(item.id) or _id("rs"), content=[ReasoningText(t) for t in texts]
        )
    _refuse(
        f"{param}.type",
        f"Input items of type {kind!r} are not supported: send messages, "
        "function_call, function_call_output and reasoning items.",
    )


def _required(value: str | msgspec.UnsetType, param: str, field: str) -> str:
    if not isinstance(value, str) or not value:
        _refuse(f"{param}.{field}", f"This item needs {field}.")
    return value


def _part_list(content: str | list[InputPart] | msgspec.UnsetType | None) -> list[InputPart]:
    return content if isinstance(content, list) else []


def _parts(
    content: str | list[InputPart] | msgspec.UnsetType | None, param: str, role: str
) -> list[Part]:
    if isinstance(content, str):
        return [OutputText(text=content) if role == "assistant" else InputText(content)]
    if not isinstance(content, list):
        _refuse(f"{param}.content", "A message needs content: a string or a list of parts.")
    return [_part(part, f"{param}.content[{index}]") for index, part in enumerate(content)]


def _part(part: InputPart, param: str) -> Part:
    text = given(part.text)
    if part.type in ("input_text", "output_text", "text"):
        if text is None:
            _refuse(f"{param}.text", f"A part of type {part.type!r} needs its text.")
        return OutputText(text=text) if part.type == "output_text" else InputText(text)
    if part.type == "input_image":
        url = given(part.image_url)
        if url is None:
            _refuse(
                f"{param}.image_url",
                "An input_image part needs image_url (file_id is not supported).",
            )
        return InputImage(image_url=url, detail=given(part.detail) or "auto")
    if part.type == "refusal" and isinstance(part.refusal, str):
        return Refusal(part.refusal)
    _refuse(
        f"{param}.type",
        f"Content parts of type {part.type!r} are not supported: send "
        "input_text and input_image parts.",
    )


def _joined(parts: list[InputPart], param: str) -> str:
    texts = []
    for index, part in enumerate(parts):
        if not isinstance(part.text, str):
            _refuse(f"{param}[{index}]", "A function_call_output takes text parts only.")
        texts.append(str(part.text))
    return "".join(texts)


def chat_request(
    request: ResponsesRequest, messages: list[dict[str, Any]], *, stream: bool
) -> ChatCompletionRequest:
    """The chat completion the response runs as (chat's own checks then apply to it)."""
    body = msgspec.to_builtins(request)
    for field in (
        "input",
        "instructions",
        "text",
        "max_output_tokens",
        "metadata",
        "store",
        "previous_response_id",
        "reasoning",
        "truncation",
        "tools",
        "tool_choice",
    ):
        body.pop(field, None)
    body["messages"] = messages
    body["stream"] = stream
    body["stream_options"] = {"include_usage": True} if stream else None
    if (tokens := given(request.max_output_tokens)) is not None:
        body["max_completion_tokens"] = tokens
    tools = _chat_tools(request)
    if tools:
        body["tools"] = tools
    choice = _tool_choice(
        None if isinstance(request.tool_choice, msgspec.UnsetType) else request.tool_choice
    )
    if choice is not None:
        body["tool_choice"] = choice
    text_format = _text_format(request)
    if text_format is not None:
        body["response_format"] = text_format
    effort = given(request.reasoning)
    if effort is not None and effort.effort is not None:
        body["reasoning_effort"] = effort.effort
    try:
        chat = msgspec.convert(body, ChatCompletionRequest)
    except msgspec.ValidationError as exc:
        raise InvalidRequestError(f"Invalid request: {exc}") from None
    return chat


def _chat_tools(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's function tools as chat's; a 400 naming any other kind of tool."""
    tools = given(request.tools) or []
    for index, tool in enumerate(tools):
        if tool.type != "function":
            _refuse(
                f"tools[{index}].type",
                f"Tools of type {tool.type!r} are built into "
                "OpenAI's service and cannot run here: send function tools.",
            )
        if not given(tool.name):
            _refuse(f"tools[{index}].name", "A function tool needs its name.")
    converted = []
    for tool in tools:
        function = msgspec.to_builtins(tool)
        function.pop("type", None)
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: str | ToolChoiceObject | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        if choice is not None and choice not in TOOL_CHOICES:
            _refuse(
                "tool_choice", f"tool_choice is one of {', '.join(TOOL_CHOICES)} or a function."
            )
        return choice
    if choice.type != "function":
        _refuse(
            "tool_choice.type",
            f"tool_choice of type {choice.type!r} is not supported: "
            "choose a function tool by name.",
        )
    if not given(choice.name):
        _refuse("tool_choice.name", "A function tool_choice needs the function's name.")
    return {"type": "function", "function": {"name": choice.name}}


def _text_format(request: ResponsesRequest) -> dict[str, Any] | None:
    text = given(request.text)
    form = given(text.format) if text is not None else None
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return {"type": "json_object"}
    if form.type == "json_schema":
        if given(form.schema) is None:
            _refuse("text.format.schema", "A json_schema format needs its schema.")
        schema = {
            "name": given(form.name) or "response",
            "schema": form.schema,
            "strict": given(form.strict),
            "description": given(form.description),
        }
        return {"type": "json_schema", "json_schema": schema}
    _refuse(
        "text.format.type",
        f"text.format.type {form.type!r} is not supported: text, json_object or json_schema.",
    )
