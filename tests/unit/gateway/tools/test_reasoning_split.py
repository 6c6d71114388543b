"""Reasoning split from answers, whole and in any chunking, on recorded outputs of each family.

Recorded texts: Qwen3's and DeepSeek-R1's from vLLM's parser tests
(vllm-project/vllm tests/reasoning/test_qwen3_reasoning_parser.py and
test_deepseekr1_reasoning_parser.py); gpt-oss's as its harmony encoding renders the messages of
vLLM's tests/tool_parsers/test_openai_tool_parser.py (analysis, a call, final).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from adapters.contract import Guide
from gateway.catalog.text.prompts import render_chat
from gateway.catalog.text.template import compile_template
from gateway.errors import InvalidRequestError
from gateway.openai.chat.plan import template_messages, template_variables
from gateway.openai.protocol import ChatCompletionRequest, ChatMessage
from gateway.tools import Folded
from gateway.tools.formats import tool_format
from gateway.tools.output import reasoning_guide
from gateway.tools.parsing import ContentParser, Parser
from gateway.tools.reasoning import PromptState, reasoning_format
from gateway.tools.reasoning.harmony import HarmonySplit
from gateway.tools.reasoning.think import ThinkSplit

CHUNKINGS = [1, 2, 3, 7, 1000]


def fold(parser: Parser, text: str, size: int) -> Folded:
    folded = Folded()
    for start in range(0, len(text), size):
        folded.add(parser.feed(text[start : start + size]))
    folded.add(parser.finish())
    return folded


THINK_CASES: list[tuple[str, PromptState, str, str | None, str]] = [
    # Qwen3 with <think> in its output (its template before 2507).
    (
        "with_think",
        "free",
        "<think>This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
    ),
    (
        "multiline",
        "free",
        "<think>This is a reasoning\nsection</think>This is the rest\nThat",
        "This is a reasoning\nsection",
        "This is the rest\nThat",
    ),
    (
        "only_open_tag",
        "free",
        "<think>This is a reasoning section",
        "This is a reasoning section",
        "",
    ),
    # Qwen3-Thinking-2507, DeepSeek-R1-0528: the template opens <think> in the prompt.
    (
        "without_start_token",
        "open",
        "This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
    ),
    (
        "truncated_no_start_token",
        "open",
        "This is a reasoning section",
        "This is a reasoning section",
        "",
    ),
    # As the models write it: newlines inside and after the tags.
    (
        "newlines",
        "open",
        "\nOkay, the user asks for 2+2.\n</think>\n\nThe answer is 4.",
        "Okay, the user asks for 2+2.",
        "The answer is 4.",
    ),
    # Thinking off: Qwen3's template closes an empty reasoning in the prompt.
    ("thinking_disabled", "closed", "This is plain content", None, "This is plain content"),
    (
        "plain_answer",
        "free",
        "No reasoning here </think> at all",
        None,
        "No reasoning here </think> at all",
    ),
]


@pytest.mark.parametrize("size", CHUNKINGS)
@pytest.mark.parametrize(("name", "state", "text", "reasoning", "content"), THINK_CASES)
def test_think_split(
    name: str, state: PromptState, text: str, reasoning: str | None, content: str, size: int
) -> None:
    folded = fold(ThinkSplit(ContentParser(), state), text, size)
    assert (folded.reasoning, folded.content) == (reasoning, content)


@pytest.mark.parametrize("size", CHUNKINGS)
def test_think_split_hands_the_answer_to_the_tool_parser(size: int) -> None:
    """GLM 4.5's recorded answer (vLLM's test_glm4_moe_tool_parser.py): reasoning, then a call."""
    fmt = reasoning_format("think", "")
    assert fmt is not None

    text = (
        "<think>I want to get the weather.</think>\n\nI will help you get the weather.\n"
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
        "<arg_key>date</arg_key>\n<arg_value>2025-08-01</arg_value>\n</tool_call>"
    )
    folded = fold(fmt.splitter(tool_format("glm45").parser(), "free"), text, size)
    assert folded.reasoning == "I want to get the weather."
    assert folded.content == "I will help you get the weather.\n"
    assert [(c.name, json.loads(c.arguments)) for c in folded.calls] == [
        ("get_weather", {"city": "Beijing", "date": "2025-08-01"})
    ]


@pytest.mark.parametrize("size", CHUNKINGS)
def test_a_tool_call_ends_a_reasoning_left_open(size: int) -> None:
    """Qwen3.5's recorded call without ``</think>`` (vLLM's test_qwen3_reasoning_parser.py)."""
    fmt = reasoning_format("think", "")
    assert fmt is not None
    text = (
        "I need to read the file.\n\n<tool_call>\n<function=bash>\n<parameter=command>"
        "\ncat /etc/hosts\n</parameter>\n</function>\n</tool_call>"
    )
    parser = fmt.splitter(tool_format("qwen3_coder").parser(), "open", ("<tool_call>",))
    folded = fold(parser, text, size)
    assert folded.reasoning == "I need to read the file."
    assert [(c.name, json.loads(c.arguments)) for c in folded.calls] == [
        ("bash", {"command": "cat /etc/hosts"})
    ]
    assert folded.content == ""


HARMONY = (
    '<|channel|>analysis<|message|>User asks: "What is the weather in Tokyo?" We need to use '
    "get_current_weather tool.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.get_current_weather <|constrain|>json<|message|>{"location": "Tokyo"}<|call|>'
)
HARMONY_FINAL = (
    "<|channel|>analysis<|message|>The user greets; answer briefly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>"
)


@pytest.mark.parametrize("size", CHUNKINGS)
def test_harmony_analysis_is_reasoning_and_commentary_to_a_function_is_a_call(size: int) -> None:
    folded = fold(HarmonySplit(ContentParser()), HARMONY, size)
    assert folded.reasoning == (
        'User asks: "What is the weather in Tokyo?" We need to use get_current_weather tool.'
    )
    assert [(c.name, json.loads(c.arguments)) for c in folded.calls] == [
        ("get_current_weather", {"location": "Tokyo"})
    ]
    assert folded.content == ""


@pytest.mark.parametrize("size", CHUNKINGS)
def test_harmony_final_channel_is_the_answer(size: int) -> None:
    folded = fold(HarmonySplit(ContentParser()), HARMONY_FINAL, size)
    assert (folded.reasoning, folded.content) == (
        "The user greets; answer briefly.",
        "Hello! How can I help?",
    )


def test_harmony_text_without_its_special_tokens_is_all_content() -> None:
    text = "analysisThe user greets.assistantfinal" + "Hello! " * 100
    folded = fold(HarmonySplit(ContentParser()), text, 5)
    assert (folded.reasoning, folded.content) == (None, text)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ '<think>\\n' }}{% if enable_thinking %}{% endif %}</think>", "think"),
        ("<|start|>assistant<|channel|>analysis<|message|>", "harmony"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", None),
    ],
)
def test_the_reasoning_format_is_read_from_the_template(
    template: str, expected: str | None
) -> None:
    fmt = reasoning_format(None, template)
    assert (fmt.name if fmt else None) == expected
    assert reasoning_format("none", template) is None


@pytest.mark.parametrize(
    ("prompt", "state"),
    [
        ("<|im_start|>assistant\n<think>\n", "open"),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", "closed"),
        ("<|im_start|>assistant\n", "free"),
    ],
)
def test_the_prompt_tells_where_the_reasoning_stands(prompt: str, state: str) -> None:
    fmt = reasoning_format("think", "")
    assert fmt is not None and fmt.state(prompt) == state


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _accepts(guide: Guide, text: str) -> bool:
    tag = json.loads(guide.guide or "")
    grammar = xgr.Grammar.from_structural_tag(json.dumps(tag))
    return bool(_is_grammar_accept_string(grammar, text))


@pytest.mark.parametrize(
    ("state", "text", "accepted"),
    [
        ("open", 'Let me think. 1 is fine.</think>\n\n{"a": 1}', True),
        ("open", '{"a": 1}', False),
        ("free", '<think>Hmm.</think>\n{"a": 1}', True),
        ("free", '{"a": 1}', True),
        ("free", '<think>Hmm.</think>\n{"a": "x"}', False),
    ],
)
def test_a_guide_starts_after_the_reasoning(state: PromptState, text: str, accepted: bool) -> None:
    fmt = reasoning_format("think", "")
    assert fmt is not None
    guide = reasoning_guide(Guide("json_schema", json.dumps(SCHEMA)), fmt, state)
    assert guide.guide_type == "structural_tag"
    assert _accepts(guide, text) is accepted


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        (
            "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
            '<|message|>{"a": 1}',
            True,
        ),
        ('<|channel|>final<|message|>{"a": 1}', True),
        ('<|channel|>final<|message|>{"a": "x"}', False),
    ],
)
def test_a_guide_starts_at_gpt_oss_final_channel(text: str, accepted: bool) -> None:
    fmt = reasoning_format("harmony", "")
    assert fmt is not None
    guide = reasoning_guide(Guide("json_schema", json.dumps(SCHEMA)), fmt, "free")
    assert _accepts(guide, text) is accepted


def test_a_tool_guide_keeps_its_trigger_after_the_reasoning() -> None:
    fmt = reasoning_format("think", "")
    assert fmt is not None
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["<tool_call>"],
            "tags": [
                {
                    "begin": '<tool_call>\n{"name": "f", "arguments": ',
                    "content": {"type": "json_schema", "json_schema": SCHEMA},
                    "end": "}\n</tool_call>",
                }
            ],
        },
    }
    auto = Guide("structural_tag", json.dumps(tag), param="tool_choice", optional=True)
    guide = reasoning_guide(auto, fmt, "open")
    assert guide.optional and guide.param == "tool_choice"
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert _accepts(guide, "I may call f.</think>\nSure. " + call)
    assert not _accepts(guide, 'I may call f.</think>\n<tool_call>\n{"name": "g"')


def _request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[], **fields)


@pytest.mark.parametrize(
    ("effort", "variables"),
    [
        ("high", {"reasoning_effort": "high", "enable_thinking": True}),
        ("none", {"reasoning_effort": "none", "enable_thinking": False}),
    ],
)
def test_reasoning_effort_reaches_the_template(effort: str, variables: dict[str, Any]) -> None:
    template = "{% if enable_thinking is false %}<think>\n\n</think>{% endif %}"
    assert template_variables(_request(reasoning_effort=effort), template) == variables
    assert template_variables(_request(), template) is None


@pytest.mark.parametrize(
    ("effort", "template", "message"),
    [
        ("extreme", "{{ reasoning_effort }}", "must be one of"),
        ("high", "{{ messages }}", "not supported with this model"),
    ],
)
def test_reasoning_effort_that_cannot_be_honoured_is_a_400(
    effort: str, template: str, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message) as caught:
        template_variables(_request(reasoning_effort=effort), template)
    assert caught.value.param == "reasoning_effort"


def test_an_earlier_answers_reasoning_reaches_the_template() -> None:
    """Sent back as ``reasoning_content`` or ``reasoning``; templates read it as either, or as
    ``thinking``."""
    template = (
        "{% for m in messages %}{% if m.thinking %}<think>{{ m.thinking }}</think>{% endif %}"
        "{{ m.content }}|{% endfor %}"
    )
    for key in ("reasoning_content", "reasoning"):
        history = msgspec.convert(
            [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4", key: "Two and two."},
            ],
            list[ChatMessage],
        )
        text = render_chat(
            compile_template(template), template_messages(history), tools=None, special_tokens={}
        )
        assert text == "2+2?|<think>Two and two.</think>4|"
