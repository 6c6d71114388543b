"""Tool calls and structured output through the gateway and a real tritonserver, with the
openai SDK. The tiny model has random weights: only guided decoding makes these answers parse."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel, Field

from tests.support.gateway import (  # noqa: F401
    ACCUMULATING_BLS_MODEL,
    BLS_MODEL,
    ENSEMBLE_MODEL,
    SYNC_BLS_MODEL,
    SYNC_ENSEMBLE_MODEL,
    gateway_url,
)

pytestmark = pytest.mark.slow
GUIDED = [ENSEMBLE_MODEL, BLS_MODEL, ACCUMULATING_BLS_MODEL]
ASK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the weather in Paris?"}
]
ROOM = 400


class Weather(BaseModel):
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)
    unit: Literal["celsius", "fahrenheit"]


class GetWeather(BaseModel):
    """Current weather of a city."""

    city: str = Field(max_length=12)
    unit: Literal["celsius", "fahrenheit"]


class GetTime(BaseModel):
    """Local time of a time zone."""

    zone: Literal["utc", "cet", "pst"]


def tool(model: type[BaseModel]) -> dict[str, Any]:
    name = "get_weather" if model is GetWeather else "get_time"
    return openai.pydantic_function_tool(model, name=name)  # type: ignore[return-value]


TOOLS = [tool(GetWeather), tool(GetTime)]
SCHEMAS: dict[str, type[BaseModel]] = {"get_weather": GetWeather, "get_time": GetTime}


@pytest.fixture(scope="module")
def client(gateway_url: str) -> Iterator[openai.OpenAI]:  # noqa: F811
    with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def check_calls(calls: Any, *, at_most: int | None = None) -> None:
    assert calls, "no tool calls"
    if at_most is not None:
        assert len(calls) <= at_most
    assert len({call.id for call in calls}) == len(calls)
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        SCHEMAS[call.function.name].model_validate_json(call.function.arguments)


@pytest.mark.parametrize("model", GUIDED)
def test_parse_with_a_pydantic_response_format(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.parse(
        model=model, messages=ASK, response_format=Weather, max_tokens=ROOM, seed=2
    )
    (choice,) = reply.choices
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Weather)


@pytest.mark.parametrize("model", [ENSEMBLE_MODEL, BLS_MODEL, ACCUMULATING_BLS_MODEL])
def test_streamed_structured_output_parses(client: openai.OpenAI, model: str) -> None:
    with client.chat.completions.stream(
        model=model,
        messages=ASK,
        response_format=Weather,
        max_tokens=ROOM,
        temperature=1.0,
        seed=6,
    ) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Weather)


def test_unguided_answers_of_the_same_request_do_not_parse(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=ENSEMBLE_MODEL, messages=ASK, max_tokens=60)
    with pytest.raises(ValueError):
        Weather.model_validate_json(reply.choices[0].message.content or "")


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("model", GUIDED)
def test_required_tool_calls(client: openai.OpenAI, model: str, parallel: bool) -> None:
    reply = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=parallel,
        max_tokens=ROOM,
        temperature=0.8,
        seed=3,
    )
    (choice,) = reply.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    check_calls(choice.message.tool_calls, at_most=None if parallel else 1)


@pytest.mark.parametrize("model", [ENSEMBLE_MODEL, ACCUMULATING_BLS_MODEL])
def test_a_named_tool_is_called(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=ROOM,
        seed=9,
    )
    (choice,) = reply.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_time"
    check_calls([call])


@pytest.mark.parametrize("choice", ["required", "named"])
@pytest.mark.parametrize("model", [ENSEMBLE_MODEL, BLS_MODEL, ACCUMULATING_BLS_MODEL])
def test_streamed_tool_call_deltas(client: openai.OpenAI, model: str, choice: str) -> None:
    """Name first, then argument fragments; the SDK's helper and a plain fold agree.

    How many fragments depends on timing: over HTTP a reader that fell behind gets the replies
    that wait as one (the paced engine's tests check that replies pass on as they come), but
    the name still comes alone, and each chunk carries one piece of one call."""
    tool_choice: Any = "required"
    if choice == "named":
        tool_choice = {"type": "function", "function": {"name": "get_weather"}}
    params: dict[str, Any] = {
        "model": model,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": tool_choice,
        "parallel_tool_calls": False,
        "max_tokens": ROOM,
        "temperature": 0.8,
        "seed": 11,
    }
    chunks = list(client.chat.completions.create(stream=True, **params))
    deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    first = deltas[0].tool_calls[0]  # type: ignore[index]
    assert first.id and first.function and first.function.name and first.function.arguments == ""
    assert len(deltas) >= 2, "the arguments come after the name"
    assert all(len(d.tool_calls) == 1 for d in deltas)  # type: ignore[arg-type]
    assert all(not d.tool_calls[0].function.name for d in deltas[1:])  # type: ignore
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    with client.chat.completions.stream(**params) as stream:
        final = stream.get_final_completion()
    check_calls(final.choices[0].message.tool_calls)
    whole = client.chat.completions.create(**params).choices[0].message.tool_calls or []
    streamed = final.choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in whole
    ]


def auto_reply(client: openai.OpenAI, *, stream: bool) -> Any:
    params: dict[str, Any] = {
        "model": ENSEMBLE_MODEL,
        "messages": ASK,
        "tools": TOOLS,
        "max_tokens": 40,
        "seed": 3,
    }
    if not stream:
        return client.chat.completions.create(**params)
    # The SDK's stream helper refuses answers cut by max_tokens; fold the chunks instead.
    state = openai.lib.streaming.chat.ChatCompletionStreamState()
    for chunk in client.chat.completions.create(stream=True, **params):
        state.handle_chunk(chunk)
    return state.current_completion_snapshot


def test_auto_without_a_call_gives_the_content_whole_and_streamed(client: openai.OpenAI) -> None:
    # The tiny model (random weights) never writes the call format's trigger, so under auto it
    # answers in text: no call, the guide left free, the same text whole and streamed.
    whole, streamed = (auto_reply(client, stream=stream) for stream in (False, True))
    for reply in (whole, streamed):
        (choice,) = reply.choices
        assert not choice.message.tool_calls
        assert choice.message.content and choice.finish_reason == "length"
    assert streamed.choices[0].message.content == whole.choices[0].message.content


def test_a_tool_loop_history_is_templated(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=ENSEMBLE_MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=ROOM,  # type: ignore[arg-type]
    )
    message = first.choices[0].message
    history: list[Any] = [
        *ASK,
        message.model_dump(exclude_none=True),
        *(
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}
            for call in message.tool_calls or []
        ),
    ]
    second = client.chat.completions.create(
        model=ENSEMBLE_MODEL,
        messages=history,
        tools=TOOLS,
        max_tokens=8,  # type: ignore[arg-type]
    )
    assert second.choices[0].message.content
    assert second.usage is not None and first.usage is not None
    # The template wrote the call and its result into the prompt.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20


def test_json_object(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=ENSEMBLE_MODEL,
        messages=ASK,
        response_format={"type": "json_object"},
        max_tokens=ROOM,
        seed=4,
    )
    # With this seed the guided answer closes well within the room; the whole text is JSON.
    (choice,) = reply.choices
    assert choice.finish_reason == "stop"
    json.loads(choice.message.content or "")


@pytest.mark.parametrize("stream", [False, True])
def test_completions_take_a_response_format(client: openai.OpenAI, stream: bool) -> None:
    schema = Weather.model_json_schema()
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}}
    reply: Any = client.completions.create(
        model=ENSEMBLE_MODEL,
        prompt="Weather:",
        max_tokens=ROOM,
        seed=12,
        stream=stream,
        extra_body={"response_format": fmt},
    )
    text = (
        "".join(c.choices[0].text for c in reply if c.choices) if stream else reply.choices[0].text
    )
    Weather.model_validate_json(text)


def test_guided_and_free_requests_run_together(client: openai.OpenAI) -> None:
    free = {"model": ENSEMBLE_MODEL, "messages": ASK, "max_tokens": 30, "seed": 5}
    alone = client.chat.completions.create(**free).choices[0].message.content

    def guided(seed: int) -> Any:
        return client.chat.completions.parse(
            model=ENSEMBLE_MODEL,
            messages=ASK,
            response_format=Weather,
            max_tokens=ROOM,
            temperature=1.0,
            seed=seed,
        )

    with ThreadPoolExecutor(8) as pool:
        structured = [pool.submit(guided, 20 + i) for i in range(4)]
        plain = [pool.submit(client.chat.completions.create, **free) for _ in range(4)]
        for future in structured:
            assert isinstance(future.result().choices[0].message.parsed, Weather)
        assert {f.result().choices[0].message.content for f in plain} == {alone}


@pytest.mark.parametrize(
    ("params", "param", "says"),
    [
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "not in tools",
        ),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "must be none, auto"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
            "cannot be combined",
        ),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0]", "function tools"),
        ({"functions": [{"name": "f"}]}, "functions", "use tools"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "not supported"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
            "needs json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": "a"}},
                }
            },
            "response_format",
            "is not a schema this model can follow",
        ),
    ],
)
def test_what_cannot_be_served_is_a_clear_400(
    client: openai.OpenAI, params: dict[str, Any], param: str | None, says: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=says) as caught:
        client.chat.completions.create(
            model=ENSEMBLE_MODEL, messages=ASK, max_tokens=8, extra_body=params
        )
    if param is not None:
        assert caught.value.body["param"] == param  # type: ignore[index]


@pytest.mark.parametrize("model", [SYNC_ENSEMBLE_MODEL, SYNC_BLS_MODEL])
def test_a_release_without_guided_inputs_refuses_structured_output(
    client: openai.OpenAI, model: str
) -> None:
    with pytest.raises(openai.BadRequestError, match="needs guided decoding") as caught:
        client.chat.completions.parse(model=model, messages=ASK, response_format=Weather)
    assert caught.value.body["param"] == "response_format"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(
            model=model,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",  # type: ignore[arg-type]
        )
    auto = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=8)  # type: ignore[arg-type]
    assert auto.choices[0].message.content
