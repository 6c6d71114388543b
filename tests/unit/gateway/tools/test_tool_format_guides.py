"""The structural tags of Qwen3-Coder, GLM 4.5, DeepSeek V3/R1/V3.1 and Kimi K2, compiled by
xgrammar: ``auto`` takes the families' recorded outputs (content and calls) and ``required``
their calls alone; malformed calls are refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from gateway.tools.formats import Function, tool_format
from tests.unit.gateway.tools.test_tool_formats_recorded import AREA, CASES, WEATHER


def _object(**properties: str) -> dict[str, Any]:
    return {"type": "object", "properties": {k: {"type": v} for k, v in properties.items()}}


FUNCTIONS = (
    AREA,
    WEATHER,
    Function("get_weather", parameters=_object(city="string", date="string", location="string")),
    Function("get_current_time", parameters=_object()),
    Function("foo", parameters=_object(x="integer")),
    Function("bar", parameters=_object(y="integer")),
    Function("get_news", parameters=_object(topic="string")),
    Function("send_email", parameters=_object(to="string", subject="string")),
    Function("process_html", parameters=_object(html="string")),
)
FAMILIES = ("qwen3_coder", "glm45", "deepseek_v3", "kimi_k2")
RECORDED = [case for case in CASES if case[0] in FAMILIES]
UNFINISHED = {
    "cut_off_keeps_whole_parameters",
    "no_name_is_content",
    "cut_off_is_content",
    "no_call_markers_is_content",
}
"""Recorded outputs whose call the output cut off or the markers do not make."""


def accepts(format_: dict[str, Any] | None, text: str) -> bool:
    assert format_ is not None
    tag = json.dumps({"type": "structural_tag", "format": format_})
    return bool(_is_grammar_accept_string(xgr.Grammar.from_structural_tag(tag), text))


@pytest.mark.parametrize(("fmt", "case", "text", "calls", "content"), RECORDED)
def test_auto_takes_the_recorded_outputs_whose_calls_are_whole(
    fmt: str, case: str, text: str, calls: list[tuple[str, Any]], content: str
) -> None:
    """A recorded call that parses is one the guide lets through; a cut-off or unmarked call
    is one it would not have let the model write."""
    auto = tool_format(fmt).auto_format(FUNCTIONS, True)
    assert accepts(auto, text) is (case not in UNFINISHED)


@pytest.mark.parametrize(("fmt", "case", "text", "calls", "content"), RECORDED)
def test_required_takes_the_recorded_calls_alone(
    fmt: str, case: str, text: str, calls: list[tuple[str, Any]], content: str
) -> None:
    required = tool_format(fmt).required_format(FUNCTIONS, True)
    whole_calls = case not in UNFINISHED and bool(calls) and not content.strip()
    assert accepts(required, text) is whole_calls


MALFORMED = [
    # A function the request did not offer.
    ("qwen3_coder", "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>"),
    # A parameter its schema does not have.
    (
        "qwen3_coder",
        "<tool_call>\n<function=foo>\n<parameter=z>\n1\n</parameter>\n</function>\n</tool_call>",
    ),
    # An integer parameter that is not one.
    (
        "qwen3_coder",
        "<tool_call>\n<function=foo>\n<parameter=x>\none\n</parameter>\n</function>\n</tool_call>",
    ),
    ("glm45", "<tool_call>rm_rf\n</tool_call>"),
    ("glm45", "<tool_call>foo\n<arg_key>x</arg_key>\n<arg_value>one</arg_value>\n</tool_call>"),
    ("glm45", "<tool_call>foo\n<arg_key>x</arg_key>\n</tool_call>"),
    # Arguments that are not JSON, a call outside its section, a section left open.
    (
        "deepseek_v3",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>foo<｜tool▁sep｜>{x: 1}<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>",
    ),
    ("deepseek_v3", '<｜tool▁call▁begin｜>foo<｜tool▁sep｜>{"x": 1}<｜tool▁call▁end｜>'),
    (
        "deepseek_v3",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>foo<｜tool▁sep｜>{"x": 1}<｜tool▁call▁end｜>',
    ),
    (
        "kimi_k2",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.foo:0"
        '{"x": 1}<|tool_call_end|><|tool_calls_section_end|>',
    ),
    (
        "kimi_k2",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.foo:0"
        '<|tool_call_argument_begin|>{"x": "1"}<|tool_call_end|><|tool_calls_section_end|>',
    ),
]


@pytest.mark.parametrize(("fmt", "text"), MALFORMED)
def test_malformed_calls_are_refused(fmt: str, text: str) -> None:
    format_ = tool_format(fmt)
    assert not accepts(format_.auto_format(FUNCTIONS, True), text)
    assert not accepts(format_.required_format(FUNCTIONS, True), text)


@pytest.mark.parametrize("fmt", FAMILIES)
def test_auto_leaves_text_free_until_the_trigger(fmt: str) -> None:
    auto = tool_format(fmt).auto_format(FUNCTIONS, True)
    assert accepts(auto, "No call needed: 2 < 3 and {json} is fine.")
    assert accepts(auto, "")
