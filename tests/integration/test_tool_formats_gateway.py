"""``tool_choice: required`` through the gateway and the tiny torch engine, which compiles each
format's structural tag: with random weights the engine still writes one call in the model's own
format (Qwen3-Coder's and GLM's XML parameters, DeepSeek's and Kimi's sections), which the
gateway reads back as the tool call the openai SDK gets, its arguments typed by the schema."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
TOOL: Any = {
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


REQUEST: Any = {
    "messages": [{"role": "user", "content": "Switch to celsius."}],
    "tools": [TOOL],
    "tool_choice": "required",
    "parallel_tool_calls": False,
    "max_tokens": 200,
    "seed": 3,
    "logprobs": True,
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


def whole(client: openai.OpenAI, fmt: str) -> tuple[str | None, str, str, str]:
    """Finish reason, function, arguments and the engine's text of a whole answer."""
    reply = client.chat.completions.create(model=fmt, **REQUEST)
    (choice,) = reply.choices
    assert not (choice.message.content or "").strip()
    (call,) = [c for c in choice.message.tool_calls or () if c.type == "function"]
    tokens = choice.logprobs.content if choice.logprobs else None
    text = "".join(token.token for token in tokens or ())
    return choice.finish_reason, call.function.name, call.function.arguments, text


def streamed(client: openai.OpenAI, fmt: str) -> tuple[str | None, str, str, str]:
    """The same of a streamed answer, folded from its chunks."""
    chunks = [c for c in client.chat.completions.create(model=fmt, stream=True, **REQUEST)]
    choices = [chunk.choices[0] for chunk in chunks if chunk.choices]
    calls = [call for choice in choices for call in choice.delta.tool_calls or ()]
    functions = [call.function for call in calls if call.function]
    tokens = [t for choice in choices if choice.logprobs for t in choice.logprobs.content or ()]
    return (
        choices[-1].finish_reason,
        "".join(f.name or "" for f in functions),
        "".join(f.arguments or "" for f in functions),
        "".join(token.token for token in tokens),
    )


@pytest.mark.parametrize("read", [whole, streamed])
@pytest.mark.parametrize("fmt", FORMATS)
def test_required_gives_one_call_in_the_models_format(
    client: openai.OpenAI, fmt: str, read: Callable[[openai.OpenAI, str], tuple[Any, ...]]
) -> None:
    finish, name, arguments, text = read(client, fmt)
    # The tokens the engine wrote are the call in the model's own format.
    assert OPENINGS[fmt] in text
    assert finish == "tool_calls"
    assert name == "set_unit"
    parsed = json.loads(arguments)
    assert parsed["unit"] in ("celsius", "fahrenheit")
    assert isinstance(parsed["verbose"], bool)
