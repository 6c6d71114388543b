"""What a request asks of its output: ``response_format``, ``tools``, ``tool_choice`` and
``parallel_tool_calls`` checked and turned into the output rules of ``gateway.tools``."""

from __future__ import annotations

import json
from dataclasses import replace

from adapters.contract import Guide
from gateway.errors import InvalidRequestError
from gateway.openai.protocol import ChatCompletionRequest, NamedToolChoice, ResponseFormat, Tool
from gateway.openai.sampling import given
from gateway.tools.formats import Function, ToolFormat
from gateway.tools.output import (
    OutputRules,
    auto_guide,
    calls_schema,
    required_guide,
)
from gateway.tools.reasoning import ReasoningFormat

TOOL_CHOICES = ("none", "auto", "required")


def response_guide(response_format: ResponseFormat | None) -> Guide | None:
    """The guide of ``response_format`` (``text``: none)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return Guide("json")
    if response_format.type == "json_schema":
        spec = given(response_format.json_schema)
        schema = given(spec.schema) if spec is not None else None
        if not isinstance(schema, dict):
            raise InvalidRequestError(
                "response_format json_schema needs json_schema.schema, a JSON schema object.",
                param="response_format.json_schema.schema",
            )
        return Guide("json_schema", json.dumps(schema))
    raise InvalidRequestError(
        f"response_format type {response_format.type!r} is not supported: use text, "
        "json_object or json_schema.",
        param="response_format.type",
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
