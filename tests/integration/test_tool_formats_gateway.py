"""``tool_choice: required`` through the gateway and the tiny torch engine, which compiles each
format's structural tag: with random weights the engine still writes one call in the model's own
format (Qwen3-Coder's and GLM's XML parameters, DeepSeek's and Kimi's sections), which the
gateway reads back as the tool call the openai SDK gets, its arguments typed by the schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import msgspec
import openai
import pytest

from deploy.sidecar.supervisor import Sidecar
from tests.support.gateway import LiveGateway, sidecar_settings

pytestmark = pytest.mark.slow
FORMATS = ("qwen3_coder", "glm45", "deepseek_v3", "kimi_k2")
OPENINGS = {
    "qwen3_coder": "<tool_call>\n<function=set_unit>\n",
    "glm45": "<tool_call>set_unit",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.set_unit:",
}
TOOL = {
    "type": "function",
    "function": {
        "name": "set_unit",
        "parameters": {
            "type": "object",
            "properties": {
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "verbose": {"type": "boolean"},
            },
            "required": ["unit", "verbose"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def client(sidecar: Sidecar, tiny_model_dir: Path) -> Iterator[openai.OpenAI]:
    base = sidecar_settings(
        sidecar, tiny_model_dir, models={f: ("tiny_ensemble", "ensemble") for f in FORMATS}
    )
    models = tuple(
        msgspec.structs.replace(model, tool_call_format=model.name) for model in base.models
    )
    gateway = LiveGateway(msgspec.structs.replace(base, models=models)).start()
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as c:
        yield c
    gateway.stop()


@pytest.mark.parametrize("fmt", FORMATS)
def test_required_gives_one_call_in_the_models_format(client: openai.OpenAI, fmt: str) -> None:
    for stream in (False, True):
        reply = client.chat.completions.create(
            model=fmt,
            messages=[{"role": "user", "content": "Switch to celsius."}],
            tools=[TOOL],  # type: ignore[list-item]
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=200,
            seed=3,
            stream=stream,
            logprobs=True,
        )
        if stream:
            chunks = list(reply)  # type: ignore[arg-type]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            deltas = [
                call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()
            ]
            name = "".join(d.function.name or "" for d in deltas if d.function)
            arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
            logprobs = [
                token
                for c in chunks
                if c.choices and c.choices[0].logprobs
                for token in c.choices[0].logprobs.content or ()
            ]
        else:
            (choice,) = reply.choices  # type: ignore[union-attr]
            finish = choice.finish_reason
            (call,) = choice.message.tool_calls or ()
            name, arguments = call.function.name, call.function.arguments  # type: ignore[union-attr]
            assert not (choice.message.content or "").strip()
            logprobs = choice.logprobs.content or []
        # The tokens the engine wrote are the call in the model's own format.
        assert OPENINGS[fmt] in "".join(token.token for token in logprobs)
        assert finish == "tool_calls"
        assert name == "set_unit"
        parsed = json.loads(arguments)
        assert parsed["unit"] in ("celsius", "fahrenheit")
        assert isinstance(parsed["verbose"], bool)
