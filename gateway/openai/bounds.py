"""The size of a request held to the deployment's bounds before any of it is tokenized or planned:
engine sequences (prompts times ``n``, times the beam width), prompts and their bytes, ``stop``
sequences, and the ``response_format`` and ``tools`` schemas the engine compiles into grammars.

Every check reads what the body decoded to and stops as soon as a bound is passed, so a hostile
request costs no more than its decoding; a refusal is an ``OversizeError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.errors import OversizeError
from gateway.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
)
from gateway.openai.sampling import given
from gateway.settings import RequestBounds

DEFAULT_MAX_CHOICES = 64
"""Engine sequences one request may start where neither the settings nor the engine say."""
TOKEN_ID_BYTES = 4
"""What one prompt token id counts for against ``max_prompt_bytes``."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """The bounds one caller's requests to one model are held to."""

    settings: RequestBounds
    max_choices: int
    """Engine sequences one request may start: the tenant's, else the model's."""
    max_n: int
    """Largest ``n`` of the model."""

    @classmethod
    def of(cls, settings: RequestBounds, max_n: int, tenant_max_choices: int | None) -> Bounds:
        """The bounds of a model's ``settings`` for a tenant (its ``max_choices`` overrides)."""
        choices = tenant_max_choices or settings.max_choices or DEFAULT_MAX_CHOICES
        return cls(settings, choices, max_n)

    def listed(self) -> dict[str, int]:
        """The bounds a client needs to know, as ``/v1/models`` lists them."""
        limits = self.settings
        return {
            "max_choices": self.max_choices,
            "max_n": self.max_n,
            "max_prompts": limits.max_prompts,
            "max_prompt_bytes": limits.max_prompt_bytes,
            "max_stop_sequences": limits.max_stop_sequences,
            "max_stop_bytes": limits.max_stop_bytes,
            "max_guide_bytes": limits.max_guide_bytes,
            "max_guide_depth": limits.max_guide_depth,
        }


def check_completion_bounds(request: CompletionRequest, bounds: Bounds) -> None:
    """Refuse a text completion over a bound, naming the field."""
    limits = bounds.settings
    prompt = request.prompt
    single = isinstance(prompt, str) or not isinstance(prompt[0], (str, list))
    prompts = 1 if single else len(prompt)
    if prompts > limits.max_prompts:
        raise OversizeError(
            f"prompt holds {prompts} prompts, more than the {limits.max_prompts} one request "
            "may send.",
            param="prompt",
        )
    _check_choices(request, prompts, bounds)
    _check_stops(request, limits)
    size = _prompt_bytes(prompt, limits.max_prompt_bytes)
    if size > limits.max_prompt_bytes:
        raise OversizeError(
            f"prompt holds more than the {limits.max_prompt_bytes} bytes one request may send "
            f"(a token id counts {TOKEN_ID_BYTES}).",
            param="prompt",
        )
    _check_response_format(request, limits)


def check_chat_bounds(request: ChatCompletionRequest, bounds: Bounds) -> None:
    """Refuse a chat completion over a bound, naming the field."""
    limits = bounds.settings
    _check_choices(request, 1, bounds)
    _check_stops(request, limits)
    size = 0
    for message in request.messages:
        size += _message_bytes(message)
        if size > limits.max_prompt_bytes:
            raise OversizeError(
                f"The messages' text holds more than the {limits.max_prompt_bytes} bytes one "
                "request may send.",
                param="messages",
            )
    _check_response_format(request, limits)
    _check_tools(request, limits)


def _message_bytes(message: ChatMessage) -> int:
    """The bytes of every text of a message the chat template renders: its content, its name,
    the id of the call it answers and the calls it made."""
    content = message.content
    size = 0
    if isinstance(content, str):
        size += len(content.encode())
    elif content is not None:
        size += sum(len(text.encode()) for text in (given(p.text) for p in content) if text)
    for text in (given(message.name), given(message.tool_call_id)):
        size += len(text.encode()) if text else 0
    for call in given(message.tool_calls) or ():
        size += len(call.function.name.encode()) + len(call.function.arguments.encode())
    return size


def sequences_asked(request: SamplingFields, prompts: int) -> int:
    """Engine sequences a request starts: ``n`` per prompt, or one beam search of the beam
    width (``best_of`` where larger than ``n``) per prompt."""
    n = given(request.n) or 1
    if given(request.use_beam_search):
        n = max(n, given(request.best_of) or n)
    return prompts * n


def _check_choices(request: SamplingFields, prompts: int, bounds: Bounds) -> None:
    asked = sequences_asked(request, prompts)
    if asked <= bounds.max_choices:
        return
    per_prompt = asked // prompts
    field = "best_of" if per_prompt > (given(request.n) or 1) else "n"
    raise OversizeError(
        f"This request asks for {asked} sequences ({prompts} prompt(s) times {per_prompt}), "
        f"more than the {bounds.max_choices} one request may start; send fewer prompts or a "
        f"smaller {field}.",
        param=field if per_prompt > 1 else "prompt",
    )


def _check_stops(request: SamplingFields, limits: RequestBounds) -> None:
    stop = given(request.stop)
    if stop is None:
        return
    stops = [stop] if isinstance(stop, str) else stop
    if len(stops) > limits.max_stop_sequences:
        raise OversizeError(
            f"stop holds {len(stops)} sequences, more than the {limits.max_stop_sequences} "
            "one request may give.",
            param="stop",
        )
    size = sum(len(text.encode()) for text in stops)
    if size > limits.max_stop_bytes:
        raise OversizeError(
            f"The stop sequences hold {size} bytes, more than the {limits.max_stop_bytes} one "
            "request may give.",
            param="stop",
        )


def _prompt_bytes(prompt: str | list[Any], most: int) -> int:
    """UTF-8 bytes of the prompt text (a token id counts ``TOKEN_ID_BYTES``), counted until
    past ``most``."""
    if isinstance(prompt, str):
        return len(prompt.encode())
    size = 0
    for item in prompt:
        if isinstance(item, str):
            size += len(item.encode())
        elif isinstance(item, list):
            size += TOKEN_ID_BYTES * len(item)
        else:
            size += TOKEN_ID_BYTES
        if size > most:
            break
    return size


def _check_response_format(request: SamplingFields, limits: RequestBounds) -> None:
    response_format = given(request.response_format)
    if response_format is None:
        return
    # The whole field: a schema, and whatever pattern or grammar a guide may carry.
    size = len(msgspec.json.encode(response_format))
    if size > limits.max_guide_bytes:
        raise OversizeError(
            f"response_format is {size} bytes, more than the {limits.max_guide_bytes} a guide "
            "may hold.",
            param="response_format",
        )
    spec = given(response_format.json_schema)
    schema = given(spec.schema) if spec is not None else None
    if schema is not None and nesting_over(schema, limits.max_guide_depth):
        raise OversizeError(
            f"response_format's JSON schema nests deeper than {limits.max_guide_depth} levels.",
            param="response_format",
        )


def _check_tools(request: ChatCompletionRequest, limits: RequestBounds) -> None:
    schemas = list(_tool_schemas(request))
    # Every tool is rendered into the prompt (its name and description too), and its schema
    # becomes the grammar of its calls: the whole definitions count.
    tools = [given(tool.function) for tool in given(request.tools) or ()]
    size = sum(len(msgspec.json.encode(tool)) for tool in tools if tool is not None)
    size += sum(len(msgspec.json.encode(legacy)) for legacy in given(request.functions) or ())
    if size > limits.max_guide_bytes:
        raise OversizeError(
            f"The tools' definitions are {size} bytes, more than the "
            f"{limits.max_guide_bytes} they may hold together.",
            param="tools",
        )
    for schema in schemas:
        if nesting_over(schema, limits.max_guide_depth):
            raise OversizeError(
                f"A tool's parameters schema nests deeper than {limits.max_guide_depth} levels.",
                param="tools",
            )


def _tool_schemas(request: ChatCompletionRequest) -> Iterator[object]:
    for tool in given(request.tools) or ():
        function = given(tool.function)
        parameters = given(function.parameters) if function is not None else None
        if parameters is not None:
            yield parameters
    for legacy in given(request.functions) or ():
        if isinstance(legacy, dict) and legacy.get("parameters") is not None:
            yield legacy["parameters"]


def nesting_over(value: object, most: int) -> bool:
    """Whether objects and arrays nest in ``value`` deeper than ``most`` levels (the value
    itself, an object, is level 1); walked without recursion, stopping at the first too deep."""
    pending: list[tuple[object, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > most:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False
