"""LangChain's ``ChatOpenAI`` against the gateway: bound tools, structured output by JSON schema
and by function calling, and a two-step agent loop (random-weight tiny model, guided)."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.support.gateway import ENSEMBLE_MODEL, gateway_url  # noqa: F401

pytestmark = pytest.mark.slow
QUESTION = "What is the weather in Paris?"


class Forecast(BaseModel):
    """A weather forecast."""

    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)
    sky: Literal["sunny", "cloudy", "rainy"]


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
    """The current weather of a city."""
    return json.dumps({"city": city, "temperature": 21, "unit": unit})


def chat(url: str, **params: Any) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        model=ENSEMBLE_MODEL,
        max_retries=0,
        **({"max_tokens": 400} | params),
    )


@pytest.mark.parametrize("streaming", [False, True])
def test_bind_tools_returns_tool_calls(gateway_url: str, streaming: bool) -> None:  # noqa: F811
    llm = chat(gateway_url, streaming=streaming, temperature=0.7, seed=2)
    bound = llm.bind_tools([get_weather], tool_choice="any", parallel_tool_calls=False)
    message = bound.invoke(QUESTION)
    assert isinstance(message, AIMessage)
    (call,) = message.tool_calls
    assert call["name"] == "get_weather"
    assert set(call["args"]) == {"city", "unit"}
    assert call["args"]["unit"] in ("celsius", "fahrenheit")
    assert call["id"]
    assert not message.invalid_tool_calls


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output(gateway_url: str, method: str) -> None:  # noqa: F811
    structured = chat(gateway_url).with_structured_output(Forecast, method=method)  # type: ignore[arg-type]
    answer = structured.invoke("Give me a forecast for Paris.")
    assert isinstance(answer, Forecast)


def test_two_step_agent_loop(gateway_url: str) -> None:  # noqa: F811
    """Call the tool, send its result back, get the final answer."""
    llm = chat(gateway_url, temperature=0.0)
    history: list[Any] = [HumanMessage(QUESTION)]
    asked = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(history)
    assert isinstance(asked, AIMessage) and asked.tool_calls
    history.append(asked)
    for call in asked.tool_calls:
        history.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    final = (
        chat(gateway_url, temperature=0.0, max_tokens=12).bind_tools([get_weather]).invoke(history)
    )
    assert isinstance(final, AIMessage)
    assert final.content or final.tool_calls
    assert final.response_metadata["finish_reason"] in ("length", "stop", "tool_calls")
