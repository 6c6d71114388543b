"""gpt-oss's channels through the gateway and a real tritonserver: the gateway decodes the
engine's token ids (entry ``tensorrt_llm``) keeping the special tokens the harmony parser reads
and dropping the others, so the openai SDK gets the reasoning and the answer apart and no marker.

The engine is the load-test engine, which writes the prompt's own token ids back in a cycle, over
the tiny tokenizer with gpt-oss's special tokens added: a prompt written in harmony's form comes
back as the model's answer, its markers as single special tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from gateway.tools.reasoning.harmony import SPECIAL_TOKENS
from tests.support.gateway import LiveGateway, sidecar_settings
from tests.support.sidecars import QUICK_STOP

pytestmark = pytest.mark.slow
TEMPLATE = "{# gpt-oss: <|channel|>analysis #}{% for m in messages %}{{ m.content }}{% endfor %}"
OTHER = "<|endofprompt|>"
"""A special token no format reads, which the client must not see."""
ANSWER = (
    "<|channel|>analysis<|message|>Two and two make four.<|end|><|start|>assistant"
    f"<|channel|>final<|message|>It is{OTHER} four.<|return|>"
)


@pytest.fixture(scope="module")
def gpt_oss_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpt-oss-tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": [*SPECIAL_TOKENS, OTHER]})
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def echo_sidecar(gpt_oss_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    engine = {"kind": "loadtest", "tokenizer_dir": str(gpt_oss_dir)}
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
def client(echo_sidecar: Sidecar, gpt_oss_dir: Path) -> Iterator[openai.OpenAI]:
    base = sidecar_settings(
        echo_sidecar, gpt_oss_dir, models={"gpt-oss": ("echo_tensorrt_llm", "tensorrt_llm")}
    )
    gateway = LiveGateway(base).start()
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as c:
        yield c
    gateway.stop()


def test_the_channels_split_and_no_special_token_reaches_the_client(
    client: openai.OpenAI,
) -> None:
    messages: Any = [{"role": "user", "content": ANSWER}]
    probe = client.chat.completions.create(model="gpt-oss", messages=messages, max_tokens=1)
    assert probe.usage is not None
    length = probe.usage.prompt_tokens
    whole = client.chat.completions.create(
        model="gpt-oss",
        messages=messages,
        max_tokens=length,
    )
    message = whole.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") == "Two and two make four."
    assert message.content == "It is four."
    streamed = client.chat.completions.create(
        model="gpt-oss",
        messages=messages,
        max_tokens=length,
        stream=True,
    )
    reasoning, content = "", ""
    for chunk in streamed:
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    assert (reasoning, content) == ("Two and two make four.", "It is four.")
