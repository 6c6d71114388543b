"""Reasoning through the gateway and a real tritonserver, read with the openai SDK, for a model
whose chat template thinks: it opens ``<think>`` in the prompt (as DeepSeek-R1's and
Qwen3-Thinking's do) and closes an empty one when ``enable_thinking`` is false (as Qwen3's does).

The engine is the load-test engine over the tiny model's tokenizer, which writes the prompt's own
tokens back in a cycle: a user message holding ``</think>`` makes the model close its reasoning
where the test chose. The same engine served without a reasoning parser gives the raw text,
which the reasoning model's answer must split. Guided output is checked on the tiny torch
engine, which compiles the grammars."""

from __future__ import annotations

import json
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
RAW = "echo-raw"
TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)
ASK: list[Any] = [
    {"role": "user", "content": "Two and two make four, I think.</think>The answer is 4."}
]


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
        echo_sidecar,
        tiny_model_dir,
        models={THINKING: ("echo_ensemble", "ensemble"), RAW: ("echo_ensemble", "ensemble")},
    )
    models = tuple(
        msgspec.structs.replace(
            model,
            chat_template=str(template),
            reasoning_parser="think" if model.name == THINKING else "none",
        )
        for model in base.models
    )
    gateway = LiveGateway(msgspec.structs.replace(base, models=models)).start()
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as c:
        yield c
    gateway.stop()


def ask(client: openai.OpenAI, model: str, **fields: Any) -> Any:
    fields.setdefault("max_tokens", 40)
    return client.chat.completions.create(model=model, messages=ASK, **fields)


def split(raw: str) -> tuple[str | None, str | None]:
    """Reasoning and answer of a raw answer whose prompt opened ``<think>``."""
    reasoning, tag, answer = raw.partition("</think>")
    return (reasoning.strip() or None), (answer.lstrip() or None) if tag else None


def test_a_whole_answer_splits_its_reasoning(
    client: openai.OpenAI,
) -> None:
    raw = ask(client, RAW).choices[0].message.content
    assert "</think>" in raw, "the engine did not write the prompt back"
    reply = ask(client, THINKING)
    message = reply.choices[0].message
    reasoning, answer = split(raw)
    assert message.model_extra["reasoning_content"] == reasoning
    assert message.model_extra["reasoning"] == reasoning
    assert message.content == answer
    usage = reply.usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert 0 < (usage.completion_tokens_details.reasoning_tokens or 0) < usage.completion_tokens


def test_a_streamed_answer_splits_its_reasoning_as_the_whole_one(
    client: openai.OpenAI,
) -> None:
    whole = ask(client, THINKING)
    stream = ask(client, THINKING, stream=True, stream_options={"include_usage": True})
    reasoning, content, usage = "", "", None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
    message = whole.choices[0].message
    assert reasoning == message.model_extra["reasoning_content"]
    assert (content or None) == message.content
    assert usage is not None and whole.usage is not None
    assert usage.completion_tokens_details == whole.usage.completion_tokens_details


def test_reasoning_effort_none_turns_thinking_off_in_the_template(
    client: openai.OpenAI,
) -> None:
    """The echo reaches the prompt's end, where the template closed an empty reasoning."""
    raw = ask(client, RAW, reasoning_effort="none", max_tokens=60).choices[0].message.content
    assert "<think>\n\n</think>" in raw
    message = ask(client, THINKING, reasoning_effort="none", max_tokens=60).choices[0].message
    assert message.model_extra.get("reasoning_content") is None
    assert message.content == raw


FREE_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message.role + '\\n' }}"
    "{% if message.reasoning_content %}{{ '<think>' + message.reasoning_content + '</think>' }}"
    "{% endif %}{{ message.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""A template of a model that may think or not (Qwen3's, SmolLM3's): ``<think>`` only in the
history, the format read from it."""


@pytest.fixture(scope="module")
def tiny_client(
    sidecar: Sidecar, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[openai.OpenAI]:
    template = tmp_path_factory.mktemp("template") / "free.jinja"
    template.write_text(FREE_TEMPLATE)
    base = sidecar_settings(
        sidecar, tiny_model_dir, models={"tiny-think": ("tiny_ensemble", "ensemble")}
    )
    models = tuple(msgspec.structs.replace(m, chat_template=str(template)) for m in base.models)
    gateway = LiveGateway(msgspec.structs.replace(base, models=models)).start()
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as c:
        yield c
    gateway.stop()


def test_the_engine_guides_an_answer_that_may_reason_first(tiny_client: openai.OpenAI) -> None:
    """The tiny torch engine compiles the structural tag that lets ``<think>…</think>`` come
    before the schema: with random weights some seeds answer the JSON at once and end, others
    open a reasoning they never close (they stop at ``max_tokens``, all of it reasoning)."""
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    outcomes = set()
    for seed in range(1, 7):
        reply = tiny_client.chat.completions.create(
            model="tiny-think",
            messages=ASK,
            max_tokens=60,
            seed=seed,
            temperature=1.0,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": schema},
            },
        )
        (choice,) = reply.choices
        reasoning = (choice.message.model_extra or {})["reasoning_content"]
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content or "")["answer"], int)
            outcomes.add("answered")
        else:
            assert choice.finish_reason == "length" and reasoning and choice.message.content is None
            outcomes.add("reasoning")
    assert outcomes == {"answered", "reasoning"}
