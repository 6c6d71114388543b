"""The size bounds of a request, checked before planning, and concurrency counted in sequences."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from adapters.contract import BeamSearch, SamplingParams
from gateway.core.plan import ChoiceSpec, Plan, Prompt
from gateway.errors import ContextLengthExceeded, InvalidRequestError, OversizeError
from gateway.openai.bounds import (
    DEFAULT_MAX_CHOICES,
    Bounds,
    check_chat_bounds,
    check_completion_bounds,
    nesting_over,
)
from gateway.openai.protocol import ChatCompletionRequest, CompletionRequest
from gateway.settings import RequestBounds
from gateway.tenancy.admission import sequences
from gateway.tenancy.quota import (
    Decision,
    Limit,
    Limits,
    MemoryStore,
    Quota,
    Rejected,
    requests_left,
)

SETTINGS = RequestBounds(
    max_choices=8,
    max_prompts=4,
    max_prompt_bytes=100,
    max_stop_sequences=2,
    max_stop_bytes=10,
    max_guide_bytes=200,
    max_guide_depth=3,
)
BOUNDS = Bounds.of(SETTINGS, max_n=8, tenant_max_choices=None)
HELLO = [{"role": "user", "content": "hello"}]


def nested(depth: int) -> dict[str, Any]:
    """A JSON schema whose objects nest ``depth`` levels (arrays of arrays... of strings)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


def deep_schema(depth: int) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": nested(depth)}}


def tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def text(body: dict[str, Any]) -> CompletionRequest:
    return msgspec.convert({"model": "m", **body}, CompletionRequest)


def chat(body: dict[str, Any]) -> ChatCompletionRequest:
    return msgspec.convert({"model": "m", "messages": HELLO, **body}, ChatCompletionRequest)


WITHIN_TEXT = [
    {"prompt": "x" * 100},
    {"prompt": ["a", "b", "c", "d"], "n": 2},
    {"prompt": list(range(25))},
    {"prompt": [[1, 2], [3]] * 2, "n": 2},
    {"prompt": "x", "n": 2, "best_of": 4, "use_beam_search": True},
    {"prompt": "x", "stop": ["abcde", "fghij"]},
    {"prompt": "x", "response_format": deep_schema(3)},
]

OVER_TEXT = [
    ({"prompt": ["x"] * 5}, "prompt", "5 prompts"),
    ({"prompt": ["x"] * 200_000}, "prompt", "200000 prompts"),
    ({"prompt": ["a", "b", "c"], "n": 3}, "n", "9 sequences"),
    ({"prompt": [[1], [2], [3], [4]], "n": 3}, "n", "12 sequences"),
    ({"prompt": "x", "n": 2, "best_of": 9, "use_beam_search": True}, "best_of", "9 sequences"),
    ({"prompt": ["a", "b", "c"], "n": 3, "use_beam_search": True}, "n", "9 sequences"),
    ({"prompt": "x" * 101}, "prompt", "the 100 bytes"),
    ({"prompt": "é" * 51}, "prompt", "the 100 bytes"),
    ({"prompt": list(range(26))}, "prompt", "the 100 bytes"),
    ({"prompt": ["x" * 60, "y" * 60]}, "prompt", "the 100 bytes"),
    ({"prompt": "x", "stop": ["a", "b", "c"]}, "stop", "3 sequences"),
    ({"prompt": "x", "stop": ["x"] * 120_000}, "stop", "120000 sequences"),
    ({"prompt": "x", "stop": "abcdefghijk"}, "stop", "11 bytes"),
    ({"prompt": "x", "response_format": deep_schema(4)}, "response_format", "deeper than 3"),
    (
        {
            "prompt": "x",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"enum": ["v" * 200]}},
            },
        },
        "response_format",
        "more than the 200",
    ),
]


@pytest.mark.parametrize("body", WITHIN_TEXT)
def test_completions_within_the_bounds_pass(body: dict[str, Any]) -> None:
    check_completion_bounds(text(body), BOUNDS)


@pytest.mark.parametrize(("body", "param", "says"), OVER_TEXT)
def test_completions_over_a_bound_are_refused_naming_the_field(
    body: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(OversizeError) as refused:
        check_completion_bounds(text(body), BOUNDS)
    assert refused.value.param == param
    assert says in refused.value.message
    assert refused.value.status_code == 400


WITHIN_CHAT = [
    {"n": 8},
    {"messages": [{"role": "user", "content": "x" * 50}, {"role": "user", "content": "y" * 50}]},
    {"stop": "0123456789"},
    {"tools": [tool(nested(3)), tool(nested(3))]},
    {"response_format": deep_schema(3)},
]

OVER_CHAT = [
    ({"n": 9}, "n", "9 sequences"),
    ({"n": 4, "best_of": 9, "use_beam_search": True}, "best_of", "9 sequences"),
    (
        {
            "messages": [
                {"role": "user", "content": "x" * 60},
                {"role": "user", "content": "y" * 60},
            ]
        },
        "messages",
        "the 100 bytes",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 101}]}]},
        "messages",
        "the 100 bytes",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x", "name": "n" * 101},
            ]
        },
        "messages",
        "the 100 bytes",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "a" * 101}}],
                },
                {"role": "tool", "content": "x", "tool_call_id": "i" * 10},
            ]
        },
        "messages",
        "the 100 bytes",
    ),
    ({"stop": ["a", "b", "c"]}, "stop", "3 sequences"),
    ({"stop": ["abcdef", "ghijk"]}, "stop", "11 bytes"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "description": "d" * 201}}]},
        "tools",
        "more than the 200",
    ),
    ({"tools": [tool(nested(1)), tool(nested(4))]}, "tools", "deeper than 3"),
    ({"tools": [tool(nested(1)), tool({"enum": ["v" * 200]})]}, "tools", "more than the 200"),
    ({"functions": [{"name": "f", "parameters": nested(4)}]}, "tools", "deeper than 3"),
    ({"response_format": deep_schema(5)}, "response_format", "deeper than 3"),
]


@pytest.mark.parametrize("body", WITHIN_CHAT)
def test_chats_within_the_bounds_pass(body: dict[str, Any]) -> None:
    check_chat_bounds(chat(body), BOUNDS)


@pytest.mark.parametrize(("body", "param", "says"), OVER_CHAT)
def test_chats_over_a_bound_are_refused_naming_the_field(
    body: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(OversizeError) as refused:
        check_chat_bounds(chat(body), BOUNDS)
    assert refused.value.param == param
    assert says in refused.value.message


@pytest.mark.parametrize(
    ("value", "most", "over"),
    [
        ({}, 1, False),
        ({"a": {}}, 1, True),
        ([[[1]]], 3, False),
        ([[[1]]], 2, True),
        ({"a": 1, "b": [1, {"c": "d"}]}, 3, False),
        ({"a": 1, "b": [1, {"c": {}}]}, 3, True),
        ("scalar", 1, False),
    ],
)
def test_nesting(value: object, most: int, over: bool) -> None:
    assert nesting_over(value, most) is over


def test_nesting_far_past_any_recursion_limit_is_found_without_recursing() -> None:
    value: list[Any] = []
    for _ in range(100_000):
        value = [value]
    assert nesting_over(value, 32)


@pytest.mark.parametrize(
    ("settings", "tenant", "expected"),
    [
        (RequestBounds(), None, DEFAULT_MAX_CHOICES),
        (RequestBounds(max_choices=16), None, 16),
        (RequestBounds(max_choices=16), 40, 40),
        (RequestBounds(), 2, 2),
    ],
)
def test_a_tenants_max_choices_overrides_the_models(
    settings: RequestBounds, tenant: int | None, expected: int
) -> None:
    bounds = Bounds.of(settings, max_n=8, tenant_max_choices=tenant)
    assert bounds.max_choices == bounds.listed()["max_choices"] == expected


def test_a_context_overflow_is_a_size_refusal() -> None:
    """The pipeline counts every ``OversizeError`` against the tenant's request limit."""
    assert issubclass(ContextLengthExceeded, OversizeError)
    assert issubclass(OversizeError, InvalidRequestError)


def _plan(*choices: ChoiceSpec) -> Plan:
    return Plan(model="m", choices=choices, stream=False, include_usage=False)


def _choice(index: int, prompt_index: int, beam: BeamSearch | None = None) -> ChoiceSpec:
    return ChoiceSpec(index, prompt_index, Prompt("p", 3), SamplingParams(max_tokens=4, beam=beam))


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        (_plan(_choice(0, 0)), 1),
        (_plan(*(_choice(i, i // 3) for i in range(6))), 6),
        (_plan(*(_choice(i, i // 2, BeamSearch(width=4, param="best_of")) for i in range(4))), 8),
    ],
    ids=["one", "two-prompts-n3", "two-beam-searches-of-4"],
)
def test_sequences_of_a_plan(plan: Plan, expected: int) -> None:
    assert sequences(plan) == expected


async def test_the_memory_store_counts_concurrency_in_sequences() -> None:
    store = MemoryStore(clock=lambda: 1000.0)
    limits = Limits(requests=Limit("requests", 600, 60, 600), concurrency=4)
    await store.admit("t", limits, 0, "first", 3)
    assert store.leases("t") == 3
    with pytest.raises(Rejected) as refused:
        await store.admit("t", limits, 0, "second", 2)
    assert refused.value.limit == "concurrency"
    await store.admit("t", limits, 0, "third", 1)
    await store.settle("t", limits, 0, "first")
    await store.admit("t", limits, 0, "second", 2)
    assert store.leases("t") == 3


THREE_A_MINUTE = Limit("requests", 3, 60, 3)


@pytest.mark.parametrize(
    ("known_limit", "remaining", "elapsed", "left"),
    [
        (THREE_A_MINUTE, 0.0, 0.0, 0.0),
        (THREE_A_MINUTE, 0.0, 10.0, 0.5),
        (THREE_A_MINUTE, 0.5, 10.0, 1.0),
        (THREE_A_MINUTE, 2.0, 600.0, 3.0),
        (Limit("requests", 6, 60, 6), 0.0, 0.0, None),
        (None, 0.0, 0.0, None),
    ],
    ids=["spent", "half-refilled", "refilled", "full-at-most", "limit-changed", "not-shown"],
)
def test_requests_left_by_the_last_answer(
    known_limit: Limit | None, remaining: float, elapsed: float, left: float | None
) -> None:
    limits = Limits(requests=THREE_A_MINUTE)
    decision = Decision(False, 0.0, 0.0, remaining, 0.0)
    known = Quota(requests=(known_limit, decision) if known_limit else None)
    assert requests_left(limits, known, elapsed) == left
