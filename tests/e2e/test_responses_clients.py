"""The Responses API's clients against the gateway and a real tritonserver: the OpenAI Agents SDK
running an agent with one function tool (whole and streamed), and LangChain's
``ChatOpenAI(use_responses_api=True)`` invoking, streaming and calling tools (random-weight tiny
model: the calls are guided)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from pydantic import Field

from tests.support.gateway import ENSEMBLE_MODEL, gateway_url  # noqa: F401

pytestmark = pytest.mark.slow
QUESTION = "What is the weather in Paris?"


def _agent(url: str, asked: list[str]) -> Agent[Any]:
    @function_tool
    def get_weather(city: Annotated[str, Field(max_length=12)]) -> str:
        """The current weather of a city."""
        asked.append(city)
        return "sunny"

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    return Agent(
        name="forecaster",
        instructions="Answer with the tool's help.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=ENSEMBLE_MODEL, openai_client=client),
        # The call is guided; the tool's answer is the agent's (a random-weight model's own
        # words never end by themselves, and the Agents SDK takes an incomplete response as
        # a failure).
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=200
        ),
        tool_use_behavior="stop_on_first_tool",
    )


async def test_an_agent_calls_its_tool_and_answers(gateway_url: str) -> None:  # noqa: F811
    set_tracing_disabled(True)
    asked: list[str] = []
    agent = _agent(gateway_url, asked)
    result = await Runner.run(agent, QUESTION, max_turns=3)
    assert len(asked) == 1
    assert result.final_output == "sunny"
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item"]

    streamed = Runner.run_streamed(agent, QUESTION, max_turns=3)
    events = [event async for event in streamed.stream_events()]
    assert len(asked) == 2
    assert any(event.type == "raw_response_event" for event in events)
    assert streamed.final_output == "sunny"


@tool
def get_weather(city: Annotated[str, Field(max_length=12)]) -> str:
    """The current weather of a city."""
    return json.dumps({"city": city, "sky": "sunny"})


def _chat(url: str, **params: Any) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        model=ENSEMBLE_MODEL,
        use_responses_api=True,
        max_retries=0,
        **({"max_tokens": 6, "temperature": 0} | params),
    )


def test_langchain_invoke_and_stream(gateway_url: str) -> None:  # noqa: F811
    llm = _chat(gateway_url)
    answer = llm.invoke(QUESTION)
    assert isinstance(answer, AIMessage)
    assert answer.text
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] == 6

    chunks = list(llm.stream(QUESTION))
    assert all(isinstance(chunk, AIMessageChunk) for chunk in chunks)
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.text == answer.text  # greedy: the same text streamed or not


def test_langchain_tools_over_two_turns(gateway_url: str) -> None:  # noqa: F811
    llm = _chat(gateway_url, max_tokens=200, temperature=0.7)
    history: list[Any] = [HumanMessage(QUESTION)]
    asked = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(history)
    assert isinstance(asked, AIMessage)
    (call,) = asked.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city"}
    history += [asked, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    final = _chat(gateway_url).bind_tools([get_weather]).invoke(history)
    assert isinstance(final, AIMessage)
    assert final.text
