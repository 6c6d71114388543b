"""What a chat answer's output is made of: content and tool calls, the guide that shapes them,
the parser that reads them, and the conversation the chat template gets."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from adapters.contract import Guide
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
    def parses(self) -> bool:
        """Whether the answer's text is parsed (into calls, or reasoning and answer)."""
        return self.mode != "text" or self.reasoning is not None

    @property
    def parses_calls(self) -> bool:
        """Whether the answer may hold tool calls."""
        return self.mode != "text"

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


def model_formats(
    format_name: str | None, reasoning_name: str | None, template: str
) -> tuple[ToolFormat, ReasoningFormat | None]:
    """A model's tool-call format and reasoning format: the ones its settings name, else the
    ones its chat template shows (gpt-oss's calls are messages of its channels: reading them
    is reading the channels)."""
    fmt = tool_format(format_name or guess_format(template))
    if fmt.name == "harmony" and reasoning_name is None:
        reasoning_name = "harmony"
    return fmt, reasoning_format(reasoning_name, template)


def special_tokens_read(
    format_name: str | None, reasoning_name: str | None, template: str
) -> tuple[str, ...]:
    """The markers a model's formats read that a tokenizer may hold as special tokens."""
    fmt, reasoning = model_formats(format_name, reasoning_name, template)
    read = (*fmt.special_tokens, *(reasoning.special_tokens if reasoning else ()))
    return tuple(dict.fromkeys(read))


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


def calls_schema(functions: tuple[Function, ...], parallel: bool) -> dict[str, Any]:
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


def auto_guide(fmt: ToolFormat, functions: tuple[Function, ...], parallel: bool) -> Guide | None:
    """A structural tag: free text, or a call once the format's trigger appears."""
    format_ = fmt.auto_format(functions, parallel)
    if format_ is None:
        return None
    tag = json.dumps({"type": "structural_tag", "format": format_})
    return Guide("structural_tag", tag, param="tool_choice", optional=True)


def required_guide(
    fmt: ToolFormat, functions: tuple[Function, ...], parallel: bool
) -> Guide | None:
    """Calls in the model's own format, at least one, the end allowed after each; None for a
    format without call tags.

    A JSON list of calls ends only where the model writes its ``]``, which a model that knows
    its own call format but not this list may never do (SmolLM2 repeats a call until
    ``max_tokens``); after a call in its own format it ends its turn as it learned to.
    """
    format_ = fmt.required_format(functions, parallel)
    if format_ is None:
        return None
    tag = {"type": "structural_tag", "format": format_}
    return Guide("structural_tag", json.dumps(tag), param="tool_choice")


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
