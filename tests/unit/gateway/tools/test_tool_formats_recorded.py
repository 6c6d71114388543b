"""The tool-call formats of Qwen3-Coder, GLM 4.5, DeepSeek V3/R1/V3.1, Kimi K2 and gpt-oss read
on recorded outputs of those models, whole and in any chunking.

Recorded texts come from vLLM's parser tests (vllm-project/vllm): tests/tool_parsers/
test_qwen3coder_tool_parser.py, test_glm4_moe_tool_parser.py, test_deepseekv31_tool_parser.py,
test_kimi_k2_tool_parser.py, test_openai_tool_parser.py (harmony messages as gpt-oss's encoding
renders them); DeepSeek V3/R1's fenced form from its chat template's own call text.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gateway.tools import Folded, special_tokens_read
from gateway.tools.formats import FORMATS, Function, guess_format, tool_format
from gateway.tools.parsing import Arguments, Parser

CHUNKINGS = [1, 2, 3, 7, 1000]


def fold(parser: Parser, text: str, size: int) -> Folded:
    folded = Folded()
    for start in range(0, len(text), size):
        folded.add(parser.feed(text[start : start + size]))
    folded.add(parser.finish())
    return folded


def calls_of(folded: Folded) -> list[tuple[str, Any]]:
    return [(call.name, json.loads(call.arguments)) for call in folded.calls]


AREA = Function(
    "calculate_area",
    parameters={
        "type": "object",
        "properties": {
            "shape": {"type": "string"},
            "dimensions": {"type": "object"},
            "precision": {"type": "integer"},
        },
    },
)
WEATHER = Function(
    "get_current_weather",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "state": {"type": "string"},
            "unit": {"type": "string"},
        },
    },
)
DALLAS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}
QWEN3_CODER_DALLAS = (
    "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
    "<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n"
    "</function>\n</tool_call>"
)
GLM_DALLAS = (
    "<tool_call>get_current_weather\n    <arg_key>city</arg_key>\n"
    "    <arg_value>Dallas</arg_value>\n"
    "    <arg_key>state</arg_key>\n    <arg_value>TX</arg_value>\n    <arg_key>unit</arg_key>\n"
    "    <arg_value>fahrenheit</arg_value>\n    </tool_call>"
)

CASES: list[tuple[str, str, str, list[tuple[str, Any]], str]] = [
    ("qwen3_coder", "single", QWEN3_CODER_DALLAS, [("get_current_weather", DALLAS)], ""),
    (
        "qwen3_coder",
        "content_then_call",
        "Sure! Let me check the weather for you." + QWEN3_CODER_DALLAS,
        [("get_current_weather", DALLAS)],
        "Sure! Let me check the weather for you.",
    ),
    (
        "qwen3_coder",
        "typed_multiline",
        "<tool_call>\n<function=calculate_area>\n<parameter=shape>\nrectangle\n</parameter>\n"
        '<parameter=dimensions>\n{"width": 10, \n "height": 20}\n</parameter>\n'
        "<parameter=precision>\n2\n</parameter>\n</function>\n</tool_call>",
        [
            (
                "calculate_area",
                {"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2},
            )
        ],
        "",
    ),
    (
        "qwen3_coder",
        "parallel",
        QWEN3_CODER_DALLAS + "\n" + QWEN3_CODER_DALLAS.replace("Dallas", "Orlando"),
        [("get_current_weather", DALLAS), ("get_current_weather", {**DALLAS, "city": "Orlando"})],
        "\n",
    ),
    ("glm45", "single", GLM_DALLAS, [("get_current_weather", DALLAS)], ""),
    (
        "glm45",
        "content_then_call",
        "I will help you get the weather.<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        "<arg_value>Beijing</arg_value>\n<arg_key>date</arg_key>\n<arg_value>2025-08-01"
        "</arg_value>\n</tool_call>",
        [("get_weather", {"city": "Beijing", "date": "2025-08-01"})],
        "I will help you get the weather.",
    ),
    (
        "glm45",
        "no_arguments",
        "<tool_call>get_current_time\n</tool_call>",
        [("get_current_time", {})],
        "",
    ),
    (
        "glm45",
        "cut_off_keeps_whole_parameters",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
        "<arg_key>date</arg_key>\n<arg_value>2025-",
        [("get_weather", {"city": "Beijing"})],
        "",
    ),
    (
        "glm45",
        "no_name_is_content",
        "<tool_call>\n</tool_call>",
        [],
        "<tool_call>\n</tool_call>",
    ),
    (
        "deepseek_v3",
        "v31_single",
        "normal text<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>foo<｜tool▁sep｜>"
        '{"x":1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        [("foo", {"x": 1})],
        "normal text",
    ),
    (
        "deepseek_v3",
        "v31_two_and_suffix",
        "some prefix text<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>foo<｜tool▁sep｜>"
        '{"x":1}<｜tool▁call▁end｜><｜tool▁call▁begin｜>bar<｜tool▁sep｜>{"y":2}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜> some suffix text",
        [("foo", {"x": 1}), ("bar", {"y": 2})],
        "some prefix text some suffix text",
    ),
    (
        "deepseek_v3",
        "v3_fenced",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        '```json\n{"location": "Tokyo"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        [("get_weather", {"location": "Tokyo"})],
        "",
    ),
    (
        "deepseek_v3",
        "cut_off_is_content",
        "Let me look that up.<｜tool▁calls▁begin｜>get_weather",
        [],
        "Let me look that up.<｜tool▁calls▁begin｜>get_weather",
    ),
    (
        "deepseek_v3",
        "no_call_markers_is_content",
        '<｜tool▁calls▁begin｜>foo<｜tool▁sep｜>{"x":1}<｜tool▁calls▁end｜>',
        [],
        '<｜tool▁calls▁begin｜>foo<｜tool▁sep｜>{"x":1}<｜tool▁calls▁end｜>',
    ),
    (
        "kimi_k2",
        "single",
        "I'll check. <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0 "
        '<|tool_call_argument_begin|>{"city": "Beijing"}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
        [("get_weather", {"city": "Beijing"})],
        "I'll check. ",
    ),
    (
        "kimi_k2",
        "three_calls",
        "Multiple tasks. <|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.get_weather:0 <|tool_call_argument_begin|>{"city": '
        '"New York"}<|tool_call_end|><|tool_call_begin|>functions.get_news:1 '
        '<|tool_call_argument_begin|>{"topic": "technology"}<|tool_call_end|>'
        "<|tool_call_begin|>functions.send_email:2 <|tool_call_argument_begin|>"
        '{"to": "user@example.com", "subject": "Daily Update"}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
        [
            ("get_weather", {"city": "New York"}),
            ("get_news", {"topic": "technology"}),
            ("send_email", {"to": "user@example.com", "subject": "Daily Update"}),
        ],
        "Multiple tasks. ",
    ),
    (
        "kimi_k2",
        "angle_brackets_in_json",
        "Process HTML. <|tool_calls_section_begin|><|tool_call_begin|>functions.process_html:0 "
        '<|tool_call_argument_begin|>{"html": "<div>content</div>"}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
        [("process_html", {"html": "<div>content</div>"})],
        "Process HTML. ",
    ),
    (
        "harmony",
        "analysis_then_call",
        '<|channel|>analysis<|message|>User asks: "What is the weather in Tokyo?" We need to use '
        "get_current_weather tool.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_current_weather <|constrain|>json<|message|>{"location": "Tokyo"}'
        "<|call|>",
        [("get_current_weather", {"location": "Tokyo"})],
        "",
    ),
    (
        "harmony",
        "call_then_final",
        "<|channel|>commentary to=functions.get_current_weather <|constrain|>json<|message|>"
        '{"location": "Tokyo"}<|call|><|start|>assistant<|channel|>final<|message|>'
        "This tool call will get the weather.<|return|>",
        [("get_current_weather", {"location": "Tokyo"})],
        "This tool call will get the weather.",
    ),
]


@pytest.mark.parametrize("size", CHUNKINGS)
@pytest.mark.parametrize(("fmt", "case", "text", "calls", "content"), CASES)
def test_recorded_outputs(
    fmt: str, case: str, text: str, calls: list[tuple[str, Any]], content: str, size: int
) -> None:
    folded = fold(tool_format(fmt).parser((AREA, WEATHER)), text, size)
    assert calls_of(folded) == calls
    assert folded.content == content


def test_kimi_keeps_the_models_call_ids_for_its_next_turn() -> None:
    text = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0 "
        '<|tool_call_argument_begin|>{"city": "Tokyo"}<|tool_call_end|><|tool_calls_section_end|>'
    )
    folded = fold(tool_format("kimi_k2").parser(), text, 4)
    assert [call.id for call in folded.calls] == ["functions.get_weather:0"]


def test_xml_parameters_are_typed_by_the_schema_only() -> None:
    """A string parameter that looks like a number stays a string."""
    text = (
        "<tool_call>\n<function=calculate_area>\n<parameter=shape>\n42\n</parameter>\n"
        "<parameter=precision>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    folded = fold(tool_format("qwen3_coder").parser((AREA,)), text, 5)
    assert calls_of(folded) == [("calculate_area", {"shape": "42", "precision": 3})]


@pytest.mark.parametrize(
    ("template", "name"),
    [
        ("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}", "qwen3_coder"),
        ("<tool_call>{{ tc.name }}\n<arg_key>{{ k }}</arg_key>", "glm45"),
        ("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}", "deepseek_v3"),
        ("<|tool_calls_section_begin|>{{ calls }}", "kimi_k2"),
        ("<|start|>assistant<|channel|>commentary to=functions.", "harmony"),
        ("<tool_call>\n{{ tool_call | tojson }}\n</tool_call>", "hermes"),
    ],
)
def test_the_format_is_read_from_the_template(template: str, name: str) -> None:
    assert guess_format(template) == name


MARKER = re.compile(r"<\|[a-z_]+\|>|<｜[^｜]+｜>|\[TOOL_CALLS\]")
"""The shapes of the families' special-token markers."""


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_format_declares_the_special_tokens_it_reads(fmt: str) -> None:
    """Every special-token marker in what a format writes, and in its family's recorded outputs,
    is one it declares, so the model's decoding keeps it."""
    format_ = tool_format(fmt)
    calls = [{"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    texts = [format_.render_calls(calls), *(case[2] for case in CASES if case[0] == fmt)]
    markers = {marker for text in texts for marker in MARKER.findall(text)}
    read = special_tokens_read(fmt, "none", "")
    if format_.reads_reasoning:
        read = special_tokens_read(fmt, None, "")
    assert markers <= set(read)


def test_reasoning_formats_declare_their_markers() -> None:
    assert {"<think>", "</think>"} <= set(special_tokens_read("hermes", "think", ""))
    harmony = special_tokens_read("harmony", None, "")
    assert {"<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>"} <= set(harmony)
    assert special_tokens_read("pythonic", "none", "") == ()


STREAMED = [
    ("qwen3_coder", QWEN3_CODER_DALLAS, "</function>", json.dumps(DALLAS)[:-1]),
    ("glm45", GLM_DALLAS, "</tool_call>", json.dumps(DALLAS)[:-1]),
    (
        "deepseek_v3",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        '```json\n{"location": "Tokyo"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "<｜tool▁call▁end｜>",
        '{"location": "Tokyo"}',
    ),
    (
        "deepseek_v3",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>foo<｜tool▁sep｜>{"x": [1, 2]}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁call▁end｜>",
        '{"x": [1, 2]}',
    ),
    (
        "kimi_k2",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0 "
        '<|tool_call_argument_begin|>{"city": "Beijing"}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
        "<|tool_call_end|>",
        '{"city": "Beijing"}',
    ),
]


@pytest.mark.parametrize("size", CHUNKINGS)
@pytest.mark.parametrize(("fmt", "text", "end", "before_end"), STREAMED)
def test_arguments_stream_before_the_call_ends(
    fmt: str, text: str, end: str, before_end: str, size: int
) -> None:
    """The call starts, and its arguments stream (JSON as written; named parameters each once
    whole), before the call's end marker comes; the end closes them."""
    parser = tool_format(fmt).parser((AREA, WEATHER))
    cut = text.index(end)
    folded = Folded()
    for start in range(0, cut, size):
        folded.add(parser.feed(text[start : min(start + size, cut)]))
    assert [call.arguments for call in folded.calls] == [before_end]
    folded.add(parser.feed(text[cut:]))
    folded.add(parser.finish())
    assert len(folded.calls) == 1 and json.loads(folded.calls[0].arguments)


@pytest.mark.parametrize("fmt", ["qwen3_coder", "glm45"])
def test_each_parameter_streams_once_whole(fmt: str) -> None:
    text = QWEN3_CODER_DALLAS if fmt == "qwen3_coder" else GLM_DALLAS
    parser = tool_format(fmt).parser((AREA, WEATHER))
    fragments = [
        piece.text for ch in text for piece in parser.feed(ch) if isinstance(piece, Arguments)
    ]
    fragments += [piece.text for piece in parser.finish() if isinstance(piece, Arguments)]
    assert fragments == ['{"city": "Dallas"', ', "state": "TX"', ', "unit": "fahrenheit"', "}"]


def test_an_enum_parameter_is_read_without_the_layout_around_it() -> None:
    """The XML grammars let whitespace pad a value; one of an ``enum`` cannot mean it, a free
    string (code, with its indentation) keeps it."""
    unit = Function(
        "set_unit",
        parameters={
            "type": "object",
            "properties": {
                "unit": {"enum": ["celsius"], "type": "string"},
                "code": {"type": "string"},
            },
        },
    )
    text = (
        "<tool_call>set_unit<arg_key>unit</arg_key><arg_value>  celsius \n</arg_value>"
        "<arg_key>code</arg_key><arg_value>    return 1\n</arg_value></tool_call>"
    )
    folded = fold(tool_format("glm45").parser((unit,)), text, 3)
    assert calls_of(folded) == [("set_unit", {"unit": "celsius", "code": "    return 1\n"})]
