"""Pure logic of tool calls and guides: parsers fed in any chunking, formats, request checks,
history writing, and the guide tensors a model may or may not take."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from adapters.contract import GenerationRequest, Guide, InvalidRequest, SamplingParams
from adapters.triton.config import parse_model_config
from adapters.triton.tensors import build_inputs
from gateway.errors import InvalidRequestError
from gateway.openai.chat.plan import output_rules
from gateway.openai.protocol import ChatCompletionRequest
from gateway.tools import Folded, OutputRules, conversation, model_formats
from gateway.tools.formats import FORMATS, Function, guess_format, tool_format
from gateway.tools.parsing import ArgumentsOnly, ObjectCalls, Parser

CHUNKINGS = [1, 2, 5, 1000]


def fold(parser: Parser, text: str, size: int) -> Folded:
    folded = Folded()
    for start in range(0, len(text), size):
        folded.add(parser.feed(text[start : start + size]))
    folded.add(parser.finish())
    return folded


def calls_of(folded: Folded) -> list[tuple[str, Any]]:
    return [(call.name, json.loads(call.arguments)) for call in folded.calls]


ARGS = {"city": 'Paris }{ " ', "n": [1, {"a": "]"}]}


@pytest.mark.parametrize("size", CHUNKINGS)
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_reads_back_what_it_writes(name: str, size: int) -> None:
    fmt = tool_format(name)
    calls = [
        {"function": {"name": "get_weather", "arguments": json.dumps(ARGS)}},
        {"function": {"name": "noop", "arguments": "{}"}},
    ]
    folded = fold(fmt.parser(), fmt.render_calls(calls), size)
    assert calls_of(folded) == [("get_weather", ARGS), ("noop", {})]
    assert not folded.content.strip()


@pytest.mark.parametrize("size", CHUNKINGS)
def test_hermes_content_around_calls_and_held_back_markers(size: int) -> None:
    text = 'Let me check. <tool_call>\n{"arguments": {"x": 1}, "name": "f"}\n</tool_call> and <tool'
    folded = fold(tool_format("hermes").parser(), text, size)
    assert calls_of(folded) == [("f", {"x": 1})]
    assert folded.content == "Let me check.  and <tool"


@pytest.mark.parametrize("size", CHUNKINGS)
def test_a_tag_without_a_call_stays_content(size: int) -> None:
    text = "a <tool_call>not json</tool_call> b"
    folded = fold(tool_format("hermes").parser(), text, size)
    assert folded.calls == [] and folded.content == text


@pytest.mark.parametrize("name", ["llama3_json", "mistral", "pythonic"])
def test_prose_is_content(name: str) -> None:
    folded = fold(tool_format(name).parser(), "  The weather is fine [really].", 3)
    assert folded.calls == [] and folded.content == "  The weather is fine [really]."


def test_special_tokens_dropped_by_postprocessing_still_parse() -> None:
    mistral = fold(tool_format("mistral").parser(), '[{"name": "f", "arguments": {}}]', 4)
    assert calls_of(mistral) == [("f", {})]
    llama = fold(tool_format("llama3_json").parser(), '{"name": "f", "parameters": {"a": 2}}', 4)
    assert calls_of(llama) == [("f", {"a": 2})]


def test_arguments_stream_as_fragments_after_the_name() -> None:
    parser = ObjectCalls()
    pieces = []
    for ch in '[{"name": "f", "arguments": {"a": "bc"}}]':
        pieces.extend(parser.feed(ch))
    kinds = [type(piece).__name__ for piece in pieces]
    assert kinds[0] == "CallStart" and kinds.count("Arguments") > 3
    assert "".join(p.text for p in pieces[1:]) == '{"a": "bc"}'  # type: ignore[union-attr]


def test_named_function_output_is_its_arguments() -> None:
    folded = fold(ArgumentsOnly("f"), '  {"a": 1}', 2)
    assert calls_of(folded) == [("f", {"a": 1})]


def test_guess_format_from_the_template() -> None:
    assert guess_format("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert guess_format("<|python_tag|>") == "llama3_json"
    assert guess_format("<tool_call>") == "hermes"
    assert guess_format(None) == "hermes"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def request(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.convert(body, ChatCompletionRequest)


def rules(body: ChatCompletionRequest, fmt: str | None, takes_tools: bool) -> OutputRules:
    """The output rules of ``body`` for a model whose template shows no format of its own, its
    tool-call format set to ``fmt``."""
    return output_rules(body, *model_formats(fmt, None, ""), takes_tools)


def test_plans_per_tool_choice() -> None:
    assert rules(request(), None, True).mode == "text"
    auto = rules(request(tools=TOOLS), None, True)
    assert auto.mode == "format" and auto.guide is not None and auto.guide.optional
    assert json.loads(auto.guide.guide or "")["format"]["triggers"] == ["<tool_call>"]
    required = rules(request(tools=TOOLS, tool_choice="required"), None, True)
    tag = json.loads(required.guide.guide or "")["format"]  # type: ignore[union-attr]
    assert required.mode == "tagged" and tag["type"] == "tags_with_separator"
    assert tag["at_least_one"] and not tag["stop_after_first"]
    required = rules(request(tools=TOOLS, tool_choice="required"), "mistral", True)
    schema = json.loads(required.guide.guide or "")  # type: ignore[union-attr]
    assert required.mode == "calls" and schema["minItems"] == 1 and "maxItems" not in schema
    single = rules(
        request(tools=TOOLS, tool_choice="required", parallel_tool_calls=False), "pythonic", True
    )
    assert json.loads(single.guide.guide or "")["maxItems"] == 1  # type: ignore[union-attr]
    named = request(
        tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    plan = rules(named, "pythonic", True)
    assert plan.mode == "arguments" and plan.function == "get_weather"
    none = rules(request(tools=TOOLS, tool_choice="none"), None, True)
    assert none.mode == "text" and none.guide is None


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("reasoning", [None, "think", "harmony"])
@pytest.mark.parametrize(
    ("fields", "calls"),
    [
        ({}, False),
        ({"response_format": {"type": "json_object"}}, False),
        ({"tools": TOOLS}, True),
        ({"tools": TOOLS, "tool_choice": "none"}, False),
        ({"tools": TOOLS, "tool_choice": "required"}, True),
        ({"tools": TOOLS, "tool_choice": NAMED}, True),
    ],
)
def test_the_rules_say_whether_the_answer_is_parsed(
    fields: dict[str, Any], calls: bool, reasoning: str | None
) -> None:
    """Shaping reads ``parses`` of the rules: the answer is parsed where it
    may hold calls or reasoning, and passes as it is otherwise."""
    output = output_rules(request(**fields), *model_formats("hermes", reasoning, ""), True)
    assert output.parses_calls is calls
    assert output.parses is (calls or reasoning is not None)


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def calls_text(fmt: str, cities: list[str]) -> str:
    calls = [
        {"function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
        for city in cities
    ]
    return tool_format(fmt).render_calls(calls)


@pytest.mark.parametrize(
    "fmt", ["hermes", "llama3_json", "qwen3_coder", "glm45", "deepseek_v3", "kimi_k2"]
)
@pytest.mark.parametrize("parallel", [True, False])
def test_a_required_grammar_ends_after_each_call(fmt: str, parallel: bool) -> None:
    """The grammar of ``required`` takes one call or more in the model's own format and lets the
    output end after any of them; no call, or text around the calls, is refused. What it takes
    parses to its calls alone, the separators between them no content."""
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    fields = {"tools": tools, "tool_choice": "required", "parallel_tool_calls": parallel}
    guide = rules(request(**fields), fmt, False).guide
    assert guide is not None and guide.guide_type == "structural_tag" and not guide.optional
    grammar = xgr.Grammar.from_structural_tag(guide.guide)
    one, two = calls_text(fmt, ["Paris"]), calls_text(fmt, ["Paris", "Oslo"])
    assert _is_grammar_accept_string(grammar, one)
    assert _is_grammar_accept_string(grammar, two) is parallel
    for refused in ("", "Sure. " + one, one + " done"):
        assert not _is_grammar_accept_string(grammar, refused)
    for size in CHUNKINGS:
        folded = fold(rules(request(**fields), fmt, False).parser(), two, size)
        assert folded.content == ""
        assert [args for _, args in calls_of(folded)] == [{"city": "Paris"}, {"city": "Oslo"}][
            : 2 if parallel else 1
        ]


def test_response_format_guides() -> None:
    assert rules(request(response_format={"type": "text"}), None, True).guide is None
    guide = rules(request(response_format={"type": "json_object"}), None, True).guide
    assert guide == Guide("json")
    schema = {"type": "object"}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    guide = rules(request(response_format=fmt), None, True).guide
    assert guide == Guide("json_schema", json.dumps(schema))


def test_pythonic_auto_has_no_structural_tag() -> None:
    plan = rules(request(tools=TOOLS), "pythonic", True)
    assert plan.mode == "format" and plan.guide is None


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": TOOLS + TOOLS},
        {"tool_choice": "auto"},
        {"tools": TOOLS, "tool_choice": {"type": "allowed_tools"}},
        {"function_call": "auto"},
        {"tools": TOOLS, "response_format": {"type": "json_object"}},
    ],
)
def test_unservable_combinations(fields: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError):
        rules(request(**fields), None, True)


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]


def test_history_for_a_template_that_takes_tools() -> None:
    plan = rules(request(tools=TOOLS), None, True)
    messages, tools = conversation(HISTORY, plan)
    assert tools == [Function("get_weather", None, TOOLS[0]["function"]["parameters"]).as_tool()]
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


def test_history_written_out_for_a_template_that_does_not() -> None:
    plan = rules(request(tools=TOOLS), "hermes", False)
    messages, tools = conversation(HISTORY, plan)
    assert tools is None
    assert messages[0]["role"] == "system" and "Be brief." in messages[0]["content"]
    assert "get_weather" in messages[0]["content"] and "<tool_call>" in messages[0]["content"]
    assert messages[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert "tool_calls" not in messages[2]
    assert messages[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}


def config(guided: dict[str, str] | None, inputs: bool = True, platform: str = "python") -> Any:
    names = ["text_input"]
    if inputs:
        names += ["guided_decoding_guide_type", "guided_decoding_guide"]
    declared = [{"name": n, "data_type": "TYPE_STRING", "dims": [1]} for n in names]
    declared.append({"name": "max_tokens", "data_type": "TYPE_INT32", "dims": [1]})
    parameters = {k: {"string_value": v} for k, v in (guided or {}).items()}
    return parse_model_config(
        {"name": "m", "backend": platform, "input": declared, "parameters": parameters}
    )


def send(model: Any, guide: Guide) -> dict[str, Any]:
    params = SamplingParams(max_tokens=4, guide=guide)
    tensors = build_inputs(GenerationRequest("r", "p", params, stream=False), model)
    return {t.name: t.array.reshape(-1)[0] for t in tensors}


def test_guide_tensors_and_who_refuses_them() -> None:
    on = config({"guided_decoding_backend": "xgrammar"})
    sent = send(on, Guide("json_schema", "{}"))
    assert sent["guided_decoding_guide_type"] == b"json_schema"
    assert sent["guided_decoding_guide"] == b"{}"
    assert "guided_decoding_guide" not in send(on, Guide("json"))
    cpp_without_info = config({"guided_decoding_backend": "xgrammar"}, platform="tensorrtllm")
    with pytest.raises(InvalidRequest, match="needs guided decoding") as caught:
        send(cpp_without_info, Guide("json", param="tool_choice"))
    assert caught.value.param == "tool_choice" and "not enabled" in caught.value.detail
    cpp = config(
        {"guided_decoding_backend": "xgrammar", "xgrammar_tokenizer_info_path": "/i.json"},
        platform="tensorrtllm",
    )
    assert "guided_decoding_guide_type" in send(cpp, Guide("json"))
    old = config(None, inputs=False)
    with pytest.raises(InvalidRequest, match="needs guided decoding") as caught:
        send(old, Guide("json"))
    assert "no guided_decoding_guide_type input" in caught.value.detail
    assert "guided_decoding_guide_type" not in send(old, Guide("json", optional=True))
