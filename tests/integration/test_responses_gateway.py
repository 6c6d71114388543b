"""``/v1/responses`` with the openai SDK through the gateway and a real tritonserver: whole,
streamed, the ``stream()`` helper, ``parse``, conversations continued by
``previous_response_id`` (a function call in the middle), stored responses owned by their tenant
in the memory store and in a real Redis, and the 400s of what cannot be honoured."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import msgspec
import openai
import pytest
from pydantic import BaseModel, Field

from deploy.sidecar.supervisor import Sidecar
from gateway.tenancy import KeyEntry, StoreSettings, TenancySettings, TenantPolicy
from gateway.tenancy.service import digest, new_key
from tests.support.gateway import LiveGateway, sidecar_settings
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow
KEYS = {name: new_key() for name in ("alpha", "beta")}
ADMIN_KEY = new_key()
QUESTION = "What is the weather in Paris?"
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather of a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Forecast(BaseModel):
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)
    sky: Literal["sunny", "cloudy", "rainy"]


@dataclass
class Gateway:
    url: str

    def client(self, tenant: str = "alpha") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEYS[tenant], max_retries=0)

    def post(self, body: dict[str, Any], tenant: str = "alpha") -> httpx.Response:
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
        return httpx.post(f"{self.url}/v1/responses", json=body, headers=headers, timeout=60)


@pytest.fixture(scope="module", params=["memory", "redis"])
def gateway(
    request: pytest.FixtureRequest,
    sidecar: Sidecar,
    tiny_model_dir: Path,
    redis_server: RedisServer,
) -> Iterator[Gateway]:
    tenancy = TenancySettings(
        tenants=tuple(TenantPolicy(name=name) for name in KEYS),
        keys=tuple(KeyEntry(tenant=name, sha256=digest(key)) for name, key in KEYS.items()),
        store=StoreSettings(kind=request.param, url=redis_server.url, prefix=request.param),
        admin_key_sha256=digest(ADMIN_KEY),
    )
    settings = msgspec.structs.replace(sidecar_settings(sidecar, tiny_model_dir), tenancy=tenancy)
    live = LiveGateway(settings).start()
    yield Gateway(live.url)
    live.stop()


def test_create_whole_and_streamed(gateway: Gateway) -> None:
    client = gateway.client()
    whole = client.responses.create(
        model="tiny", input=QUESTION, max_output_tokens=6, temperature=0, store=False
    )
    assert whole.status == "incomplete"
    assert whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    (message,) = whole.output
    assert message.type == "message" and message.role == "assistant"
    assert whole.output_text
    assert whole.usage is not None and whole.usage.output_tokens == 6
    assert whole.usage.output_tokens_details.reasoning_tokens == 0

    events = list(
        client.responses.create(
            model="tiny", input=QUESTION, max_output_tokens=6, temperature=0, stream=True
        )
    )
    assert [event.sequence_number for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.output_text == whole.output_text  # greedy: the same text either way
    assert last.response.usage == whole.usage


def test_stream_helper_and_parse(gateway: Gateway) -> None:
    """Guided by the schema, the answer ends by itself: ``response.completed``, which the
    helper needs for its final response."""
    client = gateway.client()
    ask = "A forecast for Paris."
    with client.responses.stream(
        model="tiny", input=ask, text_format=Forecast, max_output_tokens=300
    ) as stream:
        texts = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == "".join(texts)
    assert isinstance(final.output_parsed, Forecast)

    parsed = client.responses.parse(
        model="tiny", input=ask, text_format=Forecast, max_output_tokens=300
    )
    assert isinstance(parsed.output_parsed, Forecast)
    assert parsed.text is not None and parsed.text.format.type == "json_schema"


def test_three_turns_with_a_function_call(gateway: Gateway) -> None:
    client = gateway.client()
    first = client.responses.create(
        model="tiny",
        input=QUESTION,
        instructions="Use the tools.",
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
    )
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments).keys() == {"city"}
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sun"}'}
    second = client.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input=[result],  # type: ignore[list-item]
        instructions="Use the tools.",
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        max_output_tokens=4,
    )
    third = client.responses.create(
        model="tiny",
        previous_response_id=second.id,
        input="Thanks!",
        instructions="Use the tools.",
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        max_output_tokens=4,
    )
    assert second.previous_response_id == first.id

    # The second turn's prompt is the whole conversation, the call and its output included:
    # exactly what chat counts for the same messages.
    chat = client.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": QUESTION},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": '{"sky": "sun"}'},
        ],
        tools=[
            {"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}
        ],  # type: ignore[list-item]
        max_tokens=1,
    )
    assert chat.usage is not None and second.usage is not None and third.usage is not None
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens

    (item,) = client.responses.input_items.list(second.id).data
    assert item.type == "function_call_output" and item.call_id == call.call_id


def test_a_streamed_function_call(gateway: Gateway) -> None:
    with gateway.client().responses.stream(
        model="tiny",
        input=QUESTION,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=200,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[2] == "response.output_item.added"
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == json.loads(call.arguments)
    assert json.loads(call.arguments).keys() == {"city"}


def test_retrieve_delete_and_input_items(gateway: Gateway) -> None:
    client = gateway.client()
    made = client.responses.create(
        model="tiny",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
        max_output_tokens=3,
        metadata={"run": "1"},
    )
    found = client.responses.retrieve(made.id)
    assert found.output_text == made.output_text and found.metadata == {"run": "1"}
    items = client.responses.input_items.list(made.id).data
    assert [item.type for item in items] == ["message"]
    client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.create(model="tiny", input="Hi", previous_response_id=made.id)
    assert gone.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_another_tenant_gets_404(gateway: Gateway) -> None:
    made = gateway.client("alpha").responses.create(model="tiny", input="Hi", max_output_tokens=2)
    beta = gateway.client("beta")
    with pytest.raises(openai.NotFoundError):
        beta.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        beta.responses.input_items.list(made.id)
    with pytest.raises(openai.NotFoundError):
        beta.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        beta.responses.create(model="tiny", input="Hi", previous_response_id=made.id)
    assert gateway.client("alpha").responses.retrieve(made.id).id == made.id


def test_the_admin_lists_a_tenants_stored_responses(gateway: Gateway) -> None:
    made = gateway.client("beta").responses.create(model="tiny", input="Hi", max_output_tokens=2)
    path = f"{gateway.url}/admin/tenants/beta/responses"
    listed = httpx.get(path, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert listed.status_code == 200
    assert made.id in listed.json()["data"]
    assert httpx.get(path, headers={"Authorization": f"Bearer {KEYS['beta']}"}).status_code in (
        401,
        403,
    )


def test_store_false_keeps_nothing(gateway: Gateway) -> None:
    client = gateway.client()
    made = client.responses.create(model="tiny", input="Hi", max_output_tokens=2, store=False)
    assert made.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    streamed = list(
        client.responses.create(
            model="tiny", input="Hi", max_output_tokens=2, store=False, stream=True
        )
    )
    last = streamed[-1]
    assert last.type == "response.incomplete"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(last.response.id)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [WEATHER_TOOL, {"type": "file_search"}]}, "tools[1].type"),
        ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[0].type"),
        ({"tools": [{"type": "computer_use_preview"}]}, "tools[0].type"),
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools[0].type"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"include": ["reasoning.encrypted_content"]}, "include[0]"),
        ({"truncation": "auto"}, "truncation"),
        ({"reasoning": {"summary": "detailed"}}, "reasoning.summary"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
        ({"max_output_tokens": 10**7}, "max_output_tokens"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "Hi"}]}, "input[0].role"),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_1", "output": "x"}]},
            "input[0].call_id",
        ),
        ({"input": []}, "input"),
        ({"max_tokens": 5}, "max_tokens"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_field(
    gateway: Gateway, fields: dict[str, Any], param: str
) -> None:
    answer = gateway.post({"model": "tiny", "input": "Hi", **fields})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)


def test_a_continued_conversation_must_fit_the_context(
    sidecar: Sidecar, tiny_model_dir: Path
) -> None:
    """The stored turns are part of the prompt: the turn that makes it overflow the context
    is refused, though its own input is short."""
    settings = sidecar_settings(sidecar, tiny_model_dir)
    short = msgspec.structs.replace(settings.models[0], context_length=160)
    live = LiveGateway(msgspec.structs.replace(settings, models=(short,))).start()
    try:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
        last = client.responses.create(model="tiny", input="Hi " * 20, max_output_tokens=20)
        refused = None
        for _ in range(8):
            try:
                last = client.responses.create(
                    model="tiny",
                    input="Go on.",
                    previous_response_id=last.id,
                    max_output_tokens=20,
                )
            except openai.BadRequestError as exc:
                refused = exc
                break
        assert refused is not None
        assert refused.code == "context_length_exceeded"
    finally:
        live.stop()


def test_unknown_previous_response_is_a_404_in_openai_shape(gateway: Gateway) -> None:
    answer = gateway.post({"model": "tiny", "input": "Hi", "previous_response_id": "resp_none"})
    assert answer.status_code == 404
    assert answer.json() == {
        "error": {
            "message": "Response with id 'resp_none' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "not_found",
        }
    }
