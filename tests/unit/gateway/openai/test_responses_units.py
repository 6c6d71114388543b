"""The Responses room's pure parts: input items, the conversation as chat messages, chat's
answers as response items and events (checked against the openai SDK's own types), and the
memory store's time to live and bound."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import msgspec
import pytest
from msgspec import UNSET, UnsetType
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.errors import GatewayTimeoutError, InvalidRequestError
from gateway.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from gateway.openai.responses.conversation import chat_messages
from gateway.openai.responses.protocol import (
    InputText,
    Message,
    ResponseObject,
    ResponsesRequest,
)
from gateway.openai.responses.routes import page_of
from gateway.openai.responses.shape import (
    EventWriter,
    draft_now,
    response_events,
    whole_response,
)
from gateway.openai.responses.translate import (
    chat_request,
    input_items,
    refuse_unsupported,
)
from gateway.openai.sampling import given
from gateway.tenancy.config import ResponseStoreSettings
from gateway.tenancy.responses_store import MemoryResponses

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


class ReasonedDelta(ChatDelta, frozen=True, kw_only=True):
    """A chat delta of a reasoning model (the chat room's ``reasoning_content``)."""

    reasoning_content: str | UnsetType = UNSET


class ReasonedMessage(AssistantMessage, frozen=True, kw_only=True):
    """A chat message of a reasoning model."""

    reasoning_content: str | None = None


def request(**fields: Any) -> ResponsesRequest:
    return msgspec.convert({"model": "m", **fields}, ResponsesRequest)


def chunk(delta: ChatDelta, finish: str | None = None) -> ChatCompletionChunk:
    choice = ChatChunkChoice(index=0, delta=delta, finish_reason=finish)
    return ChatCompletionChunk(id="c", created=0, model="m", choices=[choice])


def test_a_conversation_becomes_chat_messages_with_calls_folded_into_the_assistant() -> None:
    history = input_items(request(input="Weather in Paris?"))
    items = input_items(
        request(
            input=[
                {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"role": "user", "content": [{"type": "input_text", "text": "And "},
                                             {"type": "input_text", "text": "Rome?"}]},
            ]
        )
    )  # fmt: skip
    assert chat_messages("Be brief.", history, items) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "And Rome?"},
    ]


def test_an_output_answering_no_call_is_a_400_naming_it() -> None:
    items = input_items(
        request(input=[{"role": "user", "content": "Hi"},
                       {"type": "function_call_output", "call_id": "nope", "output": "x"}])
    )  # fmt: skip
    with pytest.raises(InvalidRequestError) as refused:
        chat_messages(None, [], items)
    assert refused.value.param == "input[1].call_id"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": [{"type": "message", "role": "user"}]}, "input[0].content"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
         "input[0].content[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
         "input[0].content[0].image_url"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]},
         "input[0].name"),
    ],
)  # fmt: skip
def test_malformed_items_are_400s_naming_them(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        input_items(request(**fields))
    assert refused.value.param == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"n": 2}, "n"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"max_tool_calls": 1}, "max_tool_calls"),
        ({"include": ["message.output_text.logprobs"]}, "include[0]"),
    ],
)
def test_fields_that_cannot_be_honoured_are_named(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        refuse_unsupported(request(input="Hi", **fields))
    assert refused.value.param == param


def test_the_chat_request_carries_tools_choice_format_and_budget() -> None:
    body = request(
        input="Hi",
        tools=[{"type": "function", "name": "get", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "get"},
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        max_output_tokens=9,
        temperature=0.5,
        user="u",
    )
    chat = chat_request(body, [{"role": "user", "content": "Hi"}], stream=True)
    assert chat.max_completion_tokens == 9 and chat.temperature == 0.5 and chat.user == "u"
    assert chat.stream is True and chat.stream_options is not None
    assert chat.stream_options.include_usage is True
    assert isinstance(chat.tools, list) and chat.tools[0].function is not UNSET
    named = {"type": "function", "function": {"name": "get"}}
    assert msgspec.to_builtins(chat.tool_choice) == named
    assert chat.response_format is not None and chat.response_format is not UNSET
    assert chat.response_format.type == "json_schema"


def test_reasoning_effort_becomes_chats_reasoning_effort() -> None:
    asked = request(input="Hi", reasoning={"effort": "high"})
    chat = chat_request(asked, [{"role": "user", "content": "Hi"}], stream=False)
    assert chat.reasoning_effort == "high"


def _draft() -> Any:
    return draft_now(id="resp_1", model="m", text={"format": {"type": "text"}})


def test_a_whole_answer_gives_reasoning_message_and_calls_as_the_sdk_reads_them() -> None:
    message = ReasonedMessage(
        content="Let me look.",
        reasoning_content="They want weather.",
        tool_calls=[ToolCall(id="c1", function=FunctionCall(name="get", arguments="{}"))],
    )
    completion = ChatCompletion(
        id="c",
        created=0,
        model="m",
        choices=[ChatChoice(index=0, message=message, finish_reason="tool_calls")],
        usage=Usage(prompt_tokens=5, completion_tokens=7, total_tokens=12),
    )
    response = Response.model_validate(msgspec.to_builtins(whole_response(_draft(), completion)))
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.output_text == "Let me look."
    assert response.status == "completed"
    assert response.usage is not None and response.usage.total_tokens == 12


def test_streamed_chunks_become_numbered_events_the_sdk_reads() -> None:
    writer = EventWriter(_draft())
    batches = [
        [chunk(ChatDelta(role="assistant", content=""))],
        [chunk(ReasonedDelta(reasoning_content="Hmm"))],
        [chunk(ReasonedDelta(reasoning_content=", weather."))],
        [chunk(ChatDelta(content="Looking"))],
        [chunk(ChatDelta(tool_calls=[ToolCallDelta(index=0, id="c1", type="function",
                                                   function=FunctionCallDelta(name="get",
                                                                              arguments=""))]))],
        [chunk(ChatDelta(tool_calls=[ToolCallDelta(index=0,
                                                   function=FunctionCallDelta(arguments="{}"))]))],
        [chunk(ChatDelta(), finish="tool_calls")],
    ]  # fmt: skip
    events = writer.opening()
    for batch in batches:
        events.extend(writer.chunks(batch))
    response, closing = writer.ending()
    events.extend([*closing, writer.last(response)])
    parsed = [EVENTS.validate_python(msgspec.to_builtins(event)) for event in events]
    assert [event.sequence_number for event in parsed] == list(range(len(parsed)))
    assert [event.type for event in parsed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = parsed[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[0].content[0].text == "Hmm, weather."
    assert [event.output_index for event in parsed if event.type.endswith("item.done")] == [0, 1, 2]


@pytest.mark.parametrize(
    ("order", "limit", "after", "ids", "more"),
    [
        ("desc", 20, None, ["c", "b", "a"], False),
        ("asc", 2, None, ["a", "b"], True),
        ("desc", 1, "c", ["b"], True),
        ("asc", 0, "b", ["c"], False),
        ("asc", 5, "gone", [], False),
    ],
)
def test_input_items_come_a_page_at_a_time(
    order: str, limit: int, after: str | None, ids: list[str], more: bool
) -> None:
    items: list[Any] = [Message(id=name, role="user", content=[InputText(name)]) for name in "abc"]
    page = page_of(items, order, limit, after)
    assert [item.id for item in page.data] == ids
    assert page.has_more is more
    assert (page.first_id, page.last_id) == ((ids[0], ids[-1]) if ids else (None, None))


async def test_the_memory_store_keeps_a_tenants_bytes_within_its_bound() -> None:
    store = MemoryResponses(ResponseStoreSettings(max_bytes_per_tenant=10))
    await store.put("a", "r1", b"1234")
    await store.put("a", "r2", b"1234")
    await store.put("a", "r3", b"1234")
    assert await store.ids("a") == ["r2", "r3"]
    await store.put("a", "big", b"x" * 50)  # the newest stays, alone, whatever its size
    assert await store.ids("a") == ["big"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_memory_store_forgets_after_its_ttl_and_beyond_its_bound() -> None:
    clock = Clock()
    store = MemoryResponses(ResponseStoreSettings(ttl_s=10, max_per_tenant=2), clock)
    await store.put("a", "r1", b"1")
    clock.now = 5
    await store.put("a", "r2", b"2")
    await store.put("b", "r1", b"other")
    assert await store.get("a", "r1") == b"1"
    clock.now = 8
    await store.put("a", "r3", b"3")
    assert await store.ids("a") == ["r2", "r3"]  # the oldest went beyond the bound
    assert await store.get("b", "r1") == b"other"  # another tenant's bound is its own
    clock.now = 15.5  # r2 was made at 5, r3 at 8
    assert await store.get("a", "r2") is None
    assert await store.ids("a") == ["r3"]
    assert await store.delete("a", "r3") and not await store.delete("a", "r3")


async def test_a_failure_mid_stream_ends_it_with_response_failed_and_keeps_it_failed() -> None:
    async def failing() -> AsyncGenerator[list[ChatCompletionChunk], None]:
        yield [chunk(ChatDelta(role="assistant", content="The cat"))]
        yield [chunk(ChatDelta(content=" sat"))]
        raise GatewayTimeoutError("The model did not finish within 1 s.")

    kept: list[ResponseObject] = []

    async def keep(response: ResponseObject) -> None:
        kept.append(response)

    batches = [batch async for batch in response_events(_draft(), failing(), keep)]
    parsed = [EVENTS.validate_python(msgspec.to_builtins(e)) for b in batches for e in b]
    assert [event.sequence_number for event in parsed] == list(range(len(parsed)))
    assert [event.type for event in parsed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.failed",
    ]
    failed = parsed[-1].response
    assert failed.status == "failed"
    assert failed.error is not None
    assert (failed.error.code, failed.error.message) == (
        "server_error",
        "The model did not finish within 1 s.",
    )
    assert [(item.type, item.status) for item in failed.output] == [("message", "incomplete")]
    assert failed.output[0].content[0].text == "The cat sat"
    assert [response.status for response in kept] == ["failed"]


def test_an_earlier_reasoning_goes_back_with_the_assistant_message_it_came_before() -> None:
    items = input_items(
        request(
            input=[
                {"role": "user", "content": "Weather?"},
                {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "Call the tool."}]},
                {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "reasoning", "id": "rs_2", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "It is sunny."}]},
                {"role": "assistant", "content": "Sunny."},
                {"type": "reasoning", "id": "rs_3", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "Unanswered."}]},
                {"role": "user", "content": "Thanks."},
            ]
        )
    )  # fmt: skip
    messages = chat_messages(None, [], items)
    call = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}
    assert messages == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call],
         "reasoning_content": "Call the tool.", "reasoning": "Call the tool."},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny.",
         "reasoning_content": "It is sunny.", "reasoning": "It is sunny."},
        {"role": "assistant", "content": "",
         "reasoning_content": "Unanswered.", "reasoning": "Unanswered."},
        {"role": "user", "content": "Thanks."},
    ]  # fmt: skip
    chat = chat_request(request(input="x"), messages, stream=False)
    assert [given(m.reasoning_content) for m in chat.messages] == [
        None, "Call the tool.", None, "It is sunny.", "Unanswered.", None
    ]  # fmt: skip
