"""Neutral events shaped into OpenAI's objects, whole and streamed."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence

import msgspec

from adapters.contract import SamplingParams
from gateway.core.events import ChoiceEnd, ChoiceResult, Event, TextDelta
from gateway.core.plan import ChoiceSpec, Plan, Prompt
from gateway.openai.chat.plan import ChatPlan
from gateway.openai.shaping import (
    Header,
    chat_chunks,
    chat_completion,
    completion_chunks,
    text_completion,
    usage_of,
)
from gateway.tools.output import OutputRules

HEADER = Header(id="chatcmpl-1", created=7, model="m")


def plan(
    n: int = 1, *, include_usage: bool = False, echo: bool = False, logprobs: bool = False
) -> Plan:
    prompt = Prompt("Say:", 4)
    choices = tuple(ChoiceSpec(i, 0, prompt, SamplingParams(max_tokens=5)) for i in range(n))
    return Plan(
        "m", choices, stream=True, include_usage=include_usage, echo=echo, logprobs=logprobs
    )


async def replay(events: Sequence[Event]) -> AsyncGenerator[Event, None]:
    for event in events:
        yield event


def as_json(objects: Sequence[msgspec.Struct]) -> list[dict[str, object]]:
    return [msgspec.json.decode(msgspec.json.encode(o)) for o in objects]


def test_usage_counts_each_prompt_once() -> None:
    ends = [
        ChoiceEnd(0, 0, "stop", 4, 2),
        ChoiceEnd(1, 0, "length", 4, 5),
        ChoiceEnd(2, 1, "stop", 6, 1),
    ]
    assert usage_of(ends) == msgspec.convert(
        {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}, type(usage_of([]))
    )


def test_usage_reports_cached_prompt_tokens_once_per_prompt() -> None:
    ends = [
        ChoiceEnd(0, 0, "stop", 40, 2, cached_tokens=32),
        ChoiceEnd(1, 0, "stop", 40, 3, cached_tokens=32),
        ChoiceEnd(2, 1, "stop", 50, 1, cached_tokens=0),
    ]
    usage = as_json([usage_of(ends)])[0]
    assert usage == {
        "prompt_tokens": 90,
        "completion_tokens": 6,
        "total_tokens": 96,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    without = as_json([usage_of([ChoiceEnd(0, 0, "stop", 4, 2)])])[0]
    assert "prompt_tokens_details" not in without


def test_chat_completion_shape() -> None:
    result = ChoiceResult(0, "Hi", end=ChoiceEnd(0, 0, "length", 4, 5))
    body = as_json([chat_completion(plan(), [result], HEADER)])[0]
    assert body == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi"},
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9},
    }


def test_chat_logprobs_carry_tokens_and_bytes() -> None:
    result = ChoiceResult(0, "Hé", [-0.5, -1.0], ["H", "é"], ChoiceEnd(0, 0, "stop", 4, 2))
    body = as_json([chat_completion(plan(logprobs=True), [result], HEADER)])[0]
    assert body["choices"][0]["logprobs"] == {  # type: ignore[index]
        "content": [
            {"token": "H", "logprob": -0.5, "bytes": [72], "top_logprobs": []},
            {"token": "é", "logprob": -1.0, "bytes": [195, 169], "top_logprobs": []},
        ]
    }


async def test_chat_stream_sequence() -> None:
    events: list[Event] = [TextDelta(0, "Hel"), TextDelta(0, "lo"), ChoiceEnd(0, 0, "stop", 4, 2)]
    chunks = as_json(
        [
            c
            async for batch in chat_chunks(plan(include_usage=True), replay(events), HEADER)
            for c in batch
        ]
    )
    assert [c["choices"] for c in chunks] == [
        [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        [{"index": 0, "delta": {"content": "Hel"}, "logprobs": None, "finish_reason": None}],
        [{"index": 0, "delta": {"content": "lo"}, "logprobs": None, "finish_reason": None}],
        [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
        [],
    ]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-1" for c in chunks)
    assert [c["usage"] for c in chunks[:-1]] == [None] * 4
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


async def test_chat_stream_without_usage_has_no_usage_key() -> None:
    events: list[Event] = [ChoiceEnd(0, 0, "stop", 4, 0)]
    chunks = as_json(
        [c async for batch in chat_chunks(plan(), replay(events), HEADER) for c in batch]
    )
    assert len(chunks) == 2
    assert all("usage" not in c for c in chunks)


async def test_chat_stream_starts_each_choice_with_its_role() -> None:
    events: list[Event] = [
        TextDelta(1, "b"),
        TextDelta(0, "a"),
        ChoiceEnd(0, 0, "stop", 4, 1),
        ChoiceEnd(1, 0, "stop", 4, 1),
    ]
    chunks = as_json(
        [c async for batch in chat_chunks(plan(2), replay(events), HEADER) for c in batch]
    )
    deltas = [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in chunks]  # type: ignore[index]
    assert deltas == [
        (1, {"role": "assistant", "content": ""}),
        (1, {"content": "b"}),
        (0, {"role": "assistant", "content": ""}),
        (0, {"content": "a"}),
        (0, {}),
        (1, {}),
    ]


def test_text_completion_echo_and_logprobs() -> None:
    result = ChoiceResult(0, " ok", [-0.25], [" ok"], ChoiceEnd(0, 0, "stop", 4, 1))
    header = Header(id="cmpl-1", created=7, model="m")
    body = as_json([text_completion(plan(echo=True, logprobs=True), [result], header)])[0]
    assert body["object"] == "text_completion"
    assert body["choices"] == [
        {
            "index": 0,
            "text": "Say: ok",
            "logprobs": {
                "tokens": [" ok"],
                "token_logprobs": [-0.25],
                "top_logprobs": None,
                "text_offset": [4],
            },
            "finish_reason": "stop",
        }
    ]


async def test_completion_stream_echoes_the_prompt_first() -> None:
    header = Header(id="cmpl-1", created=7, model="m")
    events: list[Event] = [TextDelta(0, " ok"), ChoiceEnd(0, 0, "length", 4, 1)]
    chunks = as_json(
        [
            c
            async for batch in completion_chunks(
                plan(echo=True, include_usage=True), replay(events), header
            )
            for c in batch
        ]
    )
    assert [c["choices"] for c in chunks] == [
        [{"index": 0, "text": "Say:", "logprobs": None, "finish_reason": None}],
        [{"index": 0, "text": " ok", "logprobs": None, "finish_reason": None}],
        [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}],
        [],
    ]
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}


async def test_the_chunks_of_one_event_come_together() -> None:
    # A choice's role chunk goes out with its first text, in one write of the stream.
    events: list[Event] = [TextDelta(0, "Hel"), TextDelta(0, "lo"), ChoiceEnd(0, 0, "stop", 4, 2)]
    batches = [as_json(batch) async for batch in chat_chunks(plan(), replay(events), HEADER)]
    deltas = [[chunk["choices"][0]["delta"] for chunk in batch] for batch in batches]  # type: ignore[index]
    assert deltas == [
        [{"role": "assistant", "content": ""}, {"content": "Hel"}],
        [{"content": "lo"}],
        [{}],
    ]
    header = Header(id="cmpl-1", created=7, model="m")
    sizes = [
        len(batch)
        async for batch in completion_chunks(
            plan(echo=True, include_usage=True), replay(events), header
        )
    ]
    assert sizes == [2, 1, 1, 1]  # the echoed prompt with the first text; the usage on its own


def chat_plan(output: OutputRules, *, logprobs: bool = False) -> ChatPlan:
    base = plan(logprobs=logprobs)
    return ChatPlan(
        base.model, base.choices, stream=True, include_usage=False, logprobs=logprobs, output=output
    )


async def streamed_deltas(chat: ChatPlan, events: list[Event]) -> list[dict[str, object]]:
    return [
        chunk["choices"][0]  # type: ignore[index]
        async for batch in chat_chunks(chat, replay(events), HEADER)
        for chunk in as_json(batch)
        if chunk["choices"]
    ]


async def test_a_call_named_and_its_arguments_in_one_read_are_two_chunks() -> None:
    # As OpenAI streams them: the name alone with empty arguments, then the arguments; a
    # client folding by call index (LangChain) would otherwise see call 0 twice in one chunk.
    named = OutputRules(mode="arguments", function="get_weather")
    events: list[Event] = [
        TextDelta(0, '{"city": "Oslo"', (-0.5, -0.25), ('{"city":', ' "Oslo"')),
        TextDelta(0, "}", (-0.1,), ("}",)),
        ChoiceEnd(0, 0, "stop", 4, 2),
    ]
    choices = await streamed_deltas(chat_plan(named, logprobs=True), events)
    calls = [c["delta"]["tool_calls"] for c in choices if "tool_calls" in c["delta"]]  # type: ignore[operator,index]
    assert all(len(entries) == 1 for entries in calls)
    head, *rest = (entries[0] for entries in calls)
    assert head["function"] == {"name": "get_weather", "arguments": ""} and head["id"]
    assert [r["function"] for r in rest] == [{"arguments": '{"city": "Oslo"'}, {"arguments": "}"}]
    # The read's log probabilities ride once, on the first of the chunks it made.
    tokens = [
        [t["token"] for t in c["logprobs"]["content"]] if c.get("logprobs") else None  # type: ignore[index]
        for c in choices
        if "tool_calls" in c["delta"]  # type: ignore[operator]
    ]
    assert tokens == [['{"city":', ' "Oslo"'], None, ["}"]]
    assert choices[-1]["finish_reason"] == "tool_calls"


async def test_two_calls_in_one_read_are_a_chunk_per_piece() -> None:
    listed = OutputRules(mode="calls")
    text = '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
    events: list[Event] = [TextDelta(0, text), ChoiceEnd(0, 0, "stop", 4, 2)]
    choices = await streamed_deltas(chat_plan(listed), events)
    entries = [c["delta"]["tool_calls"] for c in choices if "tool_calls" in c["delta"]]  # type: ignore[operator,index]
    assert all(len(e) == 1 for e in entries)
    pieces = [(e[0]["index"], e[0]["function"].get("name")) for e in entries]
    assert pieces[0] == (0, "a") and (1, "b") in pieces
    assert pieces.index((1, "b")) > pieces.index((0, "a"))
    folded: dict[int, str] = {}
    for e in entries:
        folded[e[0]["index"]] = folded.get(e[0]["index"], "") + e[0]["function"]["arguments"]
    assert [msgspec.json.decode(folded[i]) for i in (0, 1)] == [{"x": 1}, {}]
