"""Plan a chat completion: validate, decide its output rules (``response_format``, ``tools``,
``tool_choice`` and ``parallel_tool_calls`` checked and turned into the rules of
``gateway.tools``), template the conversation (tools included), count its tokens, fan out ``n``
choices."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from adapters.contract import Guide
from gateway.catalog.registry import ServedModel
from gateway.core.plan import Plan
from gateway.errors import InvalidRequestError
from gateway.ids import rng
from gateway.openai.chat.images import IMAGE_PART, chat_images, counted_images
from gateway.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    NamedToolChoice,
    Tool,
)
from gateway.openai.sampling import (
    beam_choices,
    beam_search,
    check_common,
    fan_out,
    first_given,
    given,
    include_usage,
    resolve_max_tokens,
    response_guide,
    sampling_params,
)
from gateway.tools import conversation
from gateway.tools.formats import Function, ToolFormat
from gateway.tools.output import TEXT_ONLY, OutputRules, auto_guide, calls_schema, required_guide
from gateway.tools.reasoning import ReasoningFormat


@dataclass(frozen=True, slots=True)
class ChatPlan(Plan):
    """A chat's plan, with how its answer's text becomes content and tool calls."""

    output: OutputRules = TEXT_ONLY


def output_of(plan: Plan) -> OutputRules:
    """How a plan's answer text is shaped: a chat plan's rules, else text only."""
    return plan.output if isinstance(plan, ChatPlan) else TEXT_ONLY


async def plan_chat(
    model: ServedModel, request: ChatCompletionRequest, *, max_tokens_cap: int | None
) -> Plan:
    """The backend requests answering a chat completion; no choice may ask for more than
    ``max_tokens_cap`` tokens (the caller's), and one that names no length gets at most that."""
    check_chat(request, model.route.max_n)
    tokenizer = model.tokenizer
    output = output_rules(request, model.tool_format, model.reasoning, tokenizer.takes_tools)
    variables = template_variables(request, tokenizer.template_text)
    found = image_parts(request.messages)
    # A chat without images, to a model that takes none, has nothing for the images' checks.
    images = (
        chat_images(model, request.messages, found) if found or model.vision is not None else None
    )
    messages = template_messages(request.messages, parts=model.vision is not None)
    tools = None
    if output.functions or _tool_history(request.messages):
        messages, tools = conversation(messages, output)
    prompt = await tokenizer.chat_prompt(messages, tools, variables)
    if output.reasoning is not None:
        output = output.for_prompt(prompt.text, tokenizer.token_count)
    if model.vision is not None:
        prompt = counted_images(prompt, len(images.urls) if images else 0, model.vision)
    requested = first_given(request.max_completion_tokens, request.max_tokens)
    max_tokens = resolve_max_tokens(
        requested,
        model.route.defaults.max_tokens,
        prompt,
        model.context_length,
        prompt_param="messages",
        cap=max_tokens_cap,
    )
    logprobs = bool(given(request.logprobs))
    params = sampling_params(
        request,
        model.route.defaults,
        max_tokens=max_tokens,
        logprobs=logprobs,
        guide=output.guide,
    )
    n = given(request.n) or 1
    beam = beam_search(request)
    choices = (
        fan_out([prompt], n, [params], rng)
        if beam is None
        else beam_choices([prompt], n, [params], beam)
    )
    return ChatPlan(
        model=model.name,
        choices=choices,
        stream=bool(given(request.stream)),
        include_usage=include_usage(request),
        logprobs=logprobs,
        output=output,
        images=images.load if images else None,
    )


TOOL_CHOICES = ("none", "auto", "required")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")


def template_variables(request: ChatCompletionRequest, template: str) -> dict[str, Any] | None:
    """What ``reasoning_effort`` tells the chat template: the effort itself (gpt-oss's
    ``Reasoning: high``) and ``enable_thinking`` (Qwen3, SmolLM3: off for ``none``); a 400 for
    a template that reads neither, where the effort could not be honoured."""
    effort = given(request.reasoning_effort)
    if effort is None:
        return None
    if effort not in REASONING_EFFORTS:
        raise InvalidRequestError(
            f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}.",
            param="reasoning_effort",
        )
    if "reasoning_effort" not in template and "enable_thinking" not in template:
        raise InvalidRequestError(
            "reasoning_effort is not supported with this model: its chat template takes no "
            "reasoning effort nor enable_thinking.",
            param="reasoning_effort",
        )
    return {"reasoning_effort": effort, "enable_thinking": effort != "none"}


def template_messages(messages: list[ChatMessage], *, parts: bool = False) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: text content, ``developer`` as ``system``;
    with ``parts`` (a model that takes images) content lists stay lists of ``text`` and
    ``image`` parts, as Hugging Face templates take them."""
    converted = []
    for index, message in enumerate(messages):
        content: Any = _text_content(message, index)
        if parts and isinstance(message.content, list):
            content = _parts(message.content)
        entry: dict[str, Any] = {
            "role": "system" if message.role == "developer" else message.role,
            "content": content,
        }
        for key in ("name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning"):
            value = given(getattr(message, key))
            if value is not None:
                entry[key] = msgspec.to_builtins(value)
        converted.append(entry)
    return converted


def _tool_history(messages: list[ChatMessage]) -> bool:
    """Whether the conversation holds calls or their results, which the model's tool format
    may have to write out."""
    return any(message.role == "tool" or given(message.tool_calls) for message in messages)


def image_parts(messages: list[ChatMessage]) -> list[tuple[str, ContentPart]]:
    """Every image part with its ``messages[i].content[j]`` name, in conversation order."""
    found = []
    for index, message in enumerate(messages):
        if isinstance(message.content, list):
            for part_index, part in enumerate(message.content):
                if part.type == IMAGE_PART:
                    found.append((f"messages[{index}].content[{part_index}]", part))
    return found


def _parts(content: list[ContentPart]) -> list[dict[str, Any]]:
    """Text and image parts as a template reads them (``{"type": "image"}`` marks an image)."""
    return [
        {"type": "image"} if part.type == IMAGE_PART else {"type": "text", "text": part.text}
        for part in content
    ]


def _text_content(message: ChatMessage, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part_index, part in enumerate(content):
        text = given(part.text)
        if part.type == IMAGE_PART:
            continue
        if part.type != "text" or text is None:
            raise InvalidRequestError(
                f"Only text content parts are supported, got a part of type {part.type!r}.",
                param=f"messages[{index}].content[{part_index}]",
            )
        texts.append(text)
    return "".join(texts)


def check_chat(request: ChatCompletionRequest, max_n: int) -> None:
    """Reject what the deployment cannot serve, with the offending field named."""
    check_common(request, max_n)
    top = given(request.top_logprobs)
    if top:
        raise InvalidRequestError(
            "top_logprobs > 0 is not supported: TensorRT-LLM through Triton returns only the "
            "log probabilities of the sampled tokens.",
            param="top_logprobs",
        )


def _functions(tools: list[Tool] | None) -> tuple[Function, ...]:
    functions = []
    for index, tool in enumerate(tools or ()):
        function = given(tool.function)
        if tool.type != "function" or function is None:
            raise InvalidRequestError(
                f"Only function tools are supported, got a tool of type {tool.type!r}.",
                param=f"tools[{index}]",
            )
        parameters = given(function.parameters)
        functions.append(Function(function.name, given(function.description), parameters))
    names = [f.name for f in functions]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise InvalidRequestError(f"Tool names must be unique: {duplicated}.", param="tools")
    return tuple(functions)


def _choice(
    request: ChatCompletionRequest, functions: tuple[Function, ...]
) -> tuple[str, Function | None]:
    """``none``, ``auto``, ``required``, or ``function`` with the function it names."""
    choice = given(request.tool_choice)
    if choice is None:
        return ("auto" if functions else "none"), None
    if isinstance(choice, NamedToolChoice):
        named = given(choice.function)
        if choice.type != "function" or named is None:
            raise InvalidRequestError(
                'A named tool_choice is {"type": "function", "function": {"name": ...}}.',
                param="tool_choice",
            )
        function = next((f for f in functions if f.name == named.name), None)
        if function is None:
            raise InvalidRequestError(
                f"tool_choice names function {named.name!r}, which is not in tools.",
                param="tool_choice",
            )
        return "function", function
    if choice not in TOOL_CHOICES:
        raise InvalidRequestError(
            f"tool_choice must be none, auto, required or a named function, got {choice!r}.",
            param="tool_choice",
        )
    if choice != "none" and not functions:
        raise InvalidRequestError(f"tool_choice {choice!r} needs tools.", param="tool_choice")
    return str(choice), None


def output_rules(
    request: ChatCompletionRequest,
    fmt: ToolFormat,
    reasoning: ReasoningFormat | None,
    takes_tools: bool,
) -> OutputRules:
    """Check the request's output fields and decide the guide and the parsing, for a model
    writing calls in ``fmt`` and its reasoning in ``reasoning`` (None: no reasoning)."""
    if given(request.functions) is not None or given(request.function_call) is not None:
        raise InvalidRequestError(
            "functions and function_call are deprecated and not supported: use tools and "
            "tool_choice.",
            param="functions" if given(request.functions) is not None else "function_call",
        )
    functions = _functions(given(request.tools))
    choice, named = _choice(request, functions)
    parallel = given(request.parallel_tool_calls) is not False
    formatted = response_guide(given(request.response_format))
    if choice == "none":
        return OutputRules(guide=formatted, reasoning=reasoning)
    if formatted is not None:
        raise InvalidRequestError(
            f"response_format {formatted.guide_type} cannot be combined with tool_choice "
            f"{choice!r}: send tool_choice 'none', or leave response_format out.",
            param="response_format",
        )
    base = OutputRules(
        mode="format",
        functions=functions,
        tool_format=fmt,
        parallel=parallel,
        template_tools=takes_tools,
        reasoning=reasoning,
    )
    if choice == "required" and (tagged := required_guide(fmt, functions, parallel)):
        return replace(base, mode="tagged", guide=tagged)
    if choice == "required":
        schema = json.dumps(calls_schema(functions, parallel))
        return replace(base, mode="calls", guide=Guide("json_schema", schema, param="tool_choice"))
    if named is not None:
        guide = Guide("json_schema", json.dumps(named.schema), param="tool_choice")
        return replace(base, mode="arguments", function=named.name, guide=guide)
    return replace(base, guide=auto_guide(fmt, functions, parallel))
