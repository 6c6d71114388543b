"""Reasoning through ``/v1/responses``, read with the openai SDK through the gateway and a real
tritonserver: a ``reasoning`` item with the model's ``reasoning_text`` before the message, whole
and streamed (``response.reasoning_text.delta``/``.done``) and through ``responses.stream()``,
its tokens in ``output_tokens_details``, ``reasoning.effort`` reaching the template, and an
earlier turn's reasoning given back to the template when a conversation goes on.

The engine is the load-test engine over the tiny model's tokenizer, which writes the prompt back:
a user message holding ``</think>`` closes the reasoning the template opened where the test
chose (see ``test_reasoning_gateway``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from tests.support.gateway import LiveGateway, sidecar_settings
from tests.support.sidecars import QUICK_STOP

pytestmark = pytest.mark.slow
THINKING = "echo-think"
QUESTION = "Two and two make four, I think.</think>The answer is 4."
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message.role + '\\n' }}"
    "{% if message.reasoning_content %}{{ '[thought: ' + message.reasoning_content + ']' }}"
    "{% endif %}{{ message.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)
"""A thinking model's template (DeepSeek-R1's, Qwen3's) that shows earlier turns' reasoning."""


@pytest.fixture(scope="module")
def echo_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sidecar]:
    engine = {"kind": "loadtest", "tokenizer_dir": str(tiny_model_dir)}
    spec = parse_spec(
        {
            "models": [{"name": "echo", "release": "latest", "engine": engine}],
            "sidecars": [{"name": "main", **QUICK_STOP}],
        }
    )
    server = sidecar_from_spec(spec, spec.sidecars[0], tmp_path_factory.mktemp("echo"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(
    echo_sidecar: Sidecar, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[openai.OpenAI]:
    template = tmp_path_factory.mktemp("template") / "thinking.jinja"
    template.write_text(TEMPLATE)
    base = sidecar_settings(
        echo_sidecar, tiny_model_dir, models={THINKING: ("echo_ensemble", "ensemble")}
    )
    models = tuple(
        msgspec.structs.replace(model, chat_template=str(template), reasoning_parser="think")
        for model in base.models
    )
    gateway = LiveGateway(msgspec.structs.replace(base, models=models)).start()
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as c:
        yield c
    gateway.stop()


def ask(client: openai.OpenAI, **fields: Any) -> Any:
    fields.setdefault("max_output_tokens", 40)
    return client.responses.create(model=THINKING, input=QUESTION, **fields)


def reasoning_of(response: Any) -> str:
    (item,) = [item for item in response.output if item.type == "reasoning"]
    assert item.summary == []
    (part,) = item.content
    assert part.type == "reasoning_text"
    return str(part.text)


def test_a_whole_response_has_its_reasoning_item_before_the_message(
    client: openai.OpenAI,
) -> None:
    chat = client.chat.completions.create(
        model=THINKING, messages=[{"role": "user", "content": QUESTION}], max_tokens=40
    )
    message: Any = chat.choices[0].message
    response = ask(client)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert reasoning_of(response) == message.model_extra["reasoning_content"]
    assert response.output_text == message.content
    usage = response.usage
    assert chat.usage is not None and chat.usage.completion_tokens_details is not None
    assert usage.output_tokens_details.reasoning_tokens == (
        chat.usage.completion_tokens_details.reasoning_tokens
    )
    assert 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens


def test_a_streamed_response_streams_its_reasoning_as_the_whole_one(
    client: openai.OpenAI,
) -> None:
    whole = ask(client)
    events = list(ask(client, stream=True))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    types = [event.type for event in events]
    assert types[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    (done,) = [event for event in events if event.type == "response.reasoning_text.done"]
    assert deltas == done.text == reasoning_of(whole)
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
    final = events[-1].response
    # The echo never writes the end token: the answer stops at max_output_tokens.
    assert whole.status == "incomplete"
    assert events[-1].type == "response.incomplete"
    assert reasoning_of(final) == reasoning_of(whole)
    assert final.output_text == whole.output_text
    assert final.usage.output_tokens_details == whole.usage.output_tokens_details


def test_the_stream_helper_gives_the_reasoning_item_and_its_events(
    client: openai.OpenAI,
) -> None:
    whole = ask(client)
    with client.responses.stream(model=THINKING, input=QUESTION, max_output_tokens=40) as stream:
        events = list(stream)
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    # An answer cut at max_output_tokens ends with response.incomplete, which carries the
    # response (the helper's get_final_response waits for response.completed only).
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    assert deltas == reasoning_of(final) == reasoning_of(whole)
    assert final.output_text == whole.output_text


def test_reasoning_effort_none_reaches_the_template_and_turns_thinking_off(
    client: openai.OpenAI,
) -> None:
    chat = client.chat.completions.create(
        model=THINKING,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=60,
        reasoning_effort="none",
    )
    response = ask(client, max_output_tokens=60, reasoning={"effort": "none"})
    assert [item.type for item in response.output] == ["message"]
    assert "<think>\n\n</think>" in response.output_text
    assert response.output_text == chat.choices[0].message.content
    assert response.reasoning.effort == "none"
    assert response.usage.output_tokens_details.reasoning_tokens == 0


def test_a_conversation_gives_the_earlier_reasoning_back_to_the_template(
    client: openai.OpenAI,
) -> None:
    first = ask(client)
    thought = reasoning_of(first)
    second = client.responses.create(
        model=THINKING, input="Go on.", previous_response_id=first.id, max_output_tokens=200
    )
    # The echo writes the second prompt back: the template showed the first turn's reasoning.
    assert f"[thought: {thought}]" in second.output_text
