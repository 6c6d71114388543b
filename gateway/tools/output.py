"""What a chat request asks of its output: ``response_format``, ``tools``, ``tool_choice`` and
``parallel_tool_calls`` checked and turned into a guide, a parser and the template's input."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from adapters.contract import Guide
from gateway.errors import InvalidRequestError
from gateway.openai.protocol import (
    ChatCompletionRequest,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    given,
)
from gateway.tools.formats import (
    Function,
    ToolFormat,
    guess_format,
    json_arguments,
    tool_format,
)
from gateway.tools.parsing import (
    ArgumentsOnly,
    CallFilter,
    ContentParser,
    ObjectCalls,
    Parser,
)
from gateway.tools.reasoning import PromptState, ReasoningFormat, reasoning_format

Mode = Literal["text", "format", "tagged", "calls", "arguments"]
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


@dataclass(frozen=True, slots=True)
class OutputRules:
    """How a chat answer's text becomes content and tool calls, and the guide that shapes it.

    ``text``: content only; ``format``: content with calls in the model's format (``auto``);
    ``tagged``: calls in the model's format and nothing else (``required``); ``calls``: a JSON
    list of calls (``required`` in a format without call tags); ``arguments``: the JSON
    arguments of the one named function.
    """

    mode: Mode = "text"
    functions: tuple[Function, ...] = ()
    tool_format: ToolFormat | None = None
    function: str | None = None
    guide: Guide | None = None
    parallel: bool = True
    template_tools: bool = False
    """Whether ``functions`` go to the chat template (else: none, or a system message)."""
    reasoning: ReasoningFormat | None = None
    """How the model's reasoning is told from its answer (None: it is all answer)."""
    reasoning_state: PromptState = "free"
    """Where the prompt leaves the model's reasoning."""
    count_tokens: Callable[[str], int] | None = None
    """Tokens of a text, for ``reasoning_tokens``."""

    @property
    def parses_calls(self) -> bool:
        """Whether the answer may hold tool calls."""
        return self.mode != "text"

    @property
    def parses(self) -> bool:
        """Whether the answer's text is parsed (into calls, or reasoning and answer)."""
        return self.parses_calls or self.reasoning is not None

    def parser(self) -> Parser:
        """A fresh parser for one choice (only its first call without parallel calls)."""
        parser: Parser
        if self.mode == "calls":
            parser = ObjectCalls()
        elif self.mode == "arguments":
            parser = ArgumentsOnly(self.function or "")
        elif self.mode in ("format", "tagged") and self.tool_format is not None:
            parser = self.tool_format.parser(self.functions)
            if self.tool_format.reads_reasoning:
                return self._filtered(parser)
        else:
            parser = ContentParser()
        if self.reasoning is not None:
            trigger = self.tool_format.trigger() if self.tool_format else None
            calls = (trigger,) if trigger and self.mode == "format" else ()
            parser = self.reasoning.splitter(parser, self.reasoning_state, calls)
        return self._filtered(parser)

    def _filtered(self, parser: Parser) -> Parser:
        if self.mode == "text" or (self.parallel and self.mode != "tagged"):
            return parser
        return CallFilter(parser, first_only=not self.parallel, content=self.mode != "tagged")

    def for_prompt(self, prompt: str, count_tokens: Callable[[str], int]) -> OutputRules:
        """The rules once the templated ``prompt`` is known: where it leaves the reasoning,
        and a guide that lets the reasoning come first."""
        if self.reasoning is None:
            return self
        state = self.reasoning.state(prompt)
        guide = self.guide
        if guide is not None and state != "closed":
            guide = reasoning_guide(guide, self.reasoning, state)
        return replace(self, reasoning_state=state, guide=guide, count_tokens=count_tokens)


TEXT_ONLY = OutputRules()
"""Answers without tool calls."""


def _format_of(guide: Guide) -> dict[str, Any]:
    """A guide as an element of an xgrammar structural-tag format."""
    text = guide.guide or ""
    if guide.guide_type == "json":
        return {"type": "json_schema", "json_schema": {"type": "object"}}
    if guide.guide_type == "json_schema":
        return {"type": "json_schema", "json_schema": json.loads(text)}
    if guide.guide_type == "regex":
        return {"type": "regex", "pattern": text}
    if guide.guide_type == "ebnf_grammar":
        return {"type": "grammar", "grammar": text}
    format_: dict[str, Any] = json.loads(text)["format"]
    return format_


def reasoning_guide(guide: Guide, reasoning: ReasoningFormat, state: PromptState) -> Guide:
    """``guide`` after the model's reasoning: a structural tag whose first part is the
    reasoning, free text, and whose second is what ``guide`` asked for (as vLLM and SGLang
    start the grammar at the reasoning's end)."""
    format_ = reasoning.guide_format(_format_of(guide), state)
    tag = json.dumps({"type": "structural_tag", "format": format_})
    return Guide("structural_tag", tag, param=guide.param, optional=guide.optional)


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


def _calls_schema(functions: tuple[Function, ...], parallel: bool) -> dict[str, Any]:
    """A JSON list of calls, each ``{"name": <one of functions>, "arguments": <its schema>}``."""
    variants = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [f.name]}, "arguments": f.schema},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    items = variants[0] if len(variants) == 1 else {"anyOf": variants}
    schema: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _auto_guide(fmt: ToolFormat, functions: tuple[Function, ...], parallel: bool) -> Guide | None:
    """A structural tag: free text, or a call once the format's trigger appears."""
    trigger = fmt.trigger()
    tags = [fmt.call_tag(function) for function in functions]
    if trigger is None or any(tag is None for tag in tags):
        return None
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": [trigger],
            "tags": tags,
            "stop_after_first": not parallel,
        },
    }
    return Guide("structural_tag", json.dumps(tag), param="tool_choice", optional=True)


def _required_guide(
    fmt: ToolFormat, functions: tuple[Function, ...], parallel: bool
) -> Guide | None:
    """Calls in the model's own format, at least one, the end allowed after each; None for a
    format without call tags.

    A JSON list of calls ends only where the model writes its ``]``, which a model that knows
    its own call format but not this list may never do (SmolLM2 repeats a call until
    ``max_tokens``); after a call in its own format it ends its turn as it learned to.
    """
    tags = [fmt.call_tag(function) for function in functions]
    if fmt.separator is None or any(tag is None for tag in tags):
        return None
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": fmt.separator,
            "at_least_one": True,
            "stop_after_first": not parallel,
        },
    }
    return Guide("structural_tag", json.dumps(tag), param="tool_choice")


def output_rules(
    request: ChatCompletionRequest,
    format_name: str | None,
    template: str,
    takes_tools: bool,
    reasoning_name: str | None = None,
) -> OutputRules:
    """Check the request's output fields and decide the guide and the parsing (the reasoning
    format ``reasoning_name``, or the template's; ``none``: no reasoning)."""
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
    format_ = format_name or guess_format(template)
    if format_ == "harmony" and reasoning_name is None:
        # gpt-oss's calls are messages of its channels: reading them is reading the channels.
        reasoning_name = "harmony"
    reasoning = reasoning_format(reasoning_name, template)
    if choice == "none":
        return OutputRules(guide=formatted, reasoning=reasoning)
    if formatted is not None:
        raise InvalidRequestError(
            f"response_format {formatted.guide_type} cannot be combined with tool_choice "
            f"{choice!r}: send tool_choice 'none', or leave response_format out.",
            param="response_format",
        )
    fmt = tool_format(format_)
    base = OutputRules(
        mode="format",
        functions=functions,
        tool_format=fmt,
        parallel=parallel,
        template_tools=takes_tools,
        reasoning=reasoning,
    )
    if choice == "required" and (tagged := _required_guide(fmt, functions, parallel)):
        return replace(base, mode="tagged", guide=tagged)
    if choice == "required":
        schema = json.dumps(_calls_schema(functions, parallel))
        return replace(base, mode="calls", guide=Guide("json_schema", schema, param="tool_choice"))
    if named is not None:
        guide = Guide("json_schema", json.dumps(named.schema), param="tool_choice")
        return replace(base, mode="arguments", function=named.name, guide=guide)
    return replace(base, guide=_auto_guide(fmt, functions, parallel))


def conversation(
    messages: list[dict[str, Any]], output: OutputRules
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages and ``tools`` for the chat template.

    A template that takes tools gets them, with history calls' arguments as objects. Otherwise
    calls and results in the history are written out in the model's format, and the tools are
    described in a system message.
    """
    fmt = output.tool_format
    tools = [f.as_tool() for f in output.functions] if output.parses_calls else []
    has_calls = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if output.template_tools or fmt is None or not (tools or has_calls):
        return [_with_object_arguments(m) for m in messages], tools or None
    converted = [_written_out(message, fmt) for message in messages]
    if tools:
        text = fmt.instructions(output.functions)
        if converted and converted[0]["role"] == "system":
            first = converted[0]
            converted[0] = {**first, "content": f"{first['content']}\n\n{text}".lstrip()}
        else:
            converted.insert(0, {"role": "system", "content": text})
    return converted, None


def _with_object_arguments(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        function = dict(call.get("function", {}))
        if "arguments" in function:
            function["arguments"] = json_arguments(function["arguments"])
        fixed.append({**call, "function": function})
    return {**message, "tool_calls": fixed}


def _written_out(message: dict[str, Any], fmt: ToolFormat) -> dict[str, Any]:
    if message["role"] == "tool":
        return {"role": "user", "content": fmt.render_result(str(message.get("content", "")))}
    calls = message.get("tool_calls")
    if not calls:
        return message
    content = str(message.get("content") or "")
    text = fmt.render_calls(calls)
    rest = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**rest, "content": f"{content}\n{text}".lstrip("\n")}
