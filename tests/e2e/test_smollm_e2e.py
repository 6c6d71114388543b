"""End to end with a real instruct model: the zero-config demo answers a factual question."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from gateway.cli import DEMO_MODEL, demo_settings
from tests.support.gateway import LiveGateway

pytestmark = [pytest.mark.slow, pytest.mark.smollm]


@pytest.fixture(scope="module")
def demo_url() -> Iterator[str]:
    """The demo's settings served by uvicorn: the gateway starts and supervises the sidecar."""
    gateway = LiveGateway(demo_settings("127.0.0.1", 0)).start()
    deadline = time.monotonic() + 300
    while httpx.get(f"{gateway.url}/health/ready").status_code != 200:
        assert time.monotonic() < deadline, "the demo did not become ready"
        time.sleep(0.5)
    yield gateway.url
    gateway.stop()


def test_capital_of_france(demo_url: str) -> None:
    client = openai.OpenAI(base_url=f"{demo_url}/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=DEMO_MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=30,
    )
    assert "Paris" in (answer.choices[0].message.content or "")
    assert answer.choices[0].finish_reason in {"stop", "length"}
    stream = client.chat.completions.create(
        model=DEMO_MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=30,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text == answer.choices[0].message.content


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        },
    },
}


@pytest.mark.parametrize("parallel", [None, False])
@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_call_names_the_city(
    demo_url: str, stream: bool, parallel: bool | None
) -> None:
    """A required call ends after the calls the model makes, with ``tool_calls``: the grammar
    lets the model end its turn after each call (with parallel calls allowed, too), so the
    SDK's stream helper gets a finished answer rather than calls repeated to ``max_tokens``."""
    client = openai.OpenAI(base_url=f"{demo_url}/v1", api_key="unused", max_retries=0)
    params: dict[str, Any] = {
        "model": DEMO_MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 256,
    }
    if parallel is not None:
        params["parallel_tool_calls"] = parallel
    if stream:
        with client.chat.completions.stream(**params) as events:
            answer = events.get_final_completion()
    else:
        answer = client.chat.completions.create(**params)
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert calls and (len(calls) == 1 or parallel is None)
    for call in calls:
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}


@pytest.mark.parametrize("stream", [False, True])
def test_log_probs_after_a_stop_cut_spell_the_answer(demo_url: str, stream: bool) -> None:
    """SmolLM2's tokens (byte-level BPE, a word's leading space inside its token): a stop that
    begins inside the token " Paris" leaves " P" of it, and the log probs spell the answer."""
    client = openai.OpenAI(base_url=f"{demo_url}/v1", api_key="unused", max_retries=0)
    question: Any = [{"role": "user", "content": "What is the capital of France?"}]
    params: dict[str, Any] = {"model": DEMO_MODEL, "temperature": 0, "max_tokens": 30}
    full = client.chat.completions.create(messages=question, **params)
    content = full.choices[0].message.content or ""
    assert " Paris" in content
    expected = content[: content.index(" Paris") + 2]
    params |= {"stop": ["aris"], "logprobs": True}
    tokens: list[str] = []
    if stream:
        text = ""
        chunks: openai.Stream[ChatCompletionChunk] = client.chat.completions.create(
            messages=question, stream=True, **params
        )
        for chunk in chunks:
            (choice,) = chunk.choices
            entries = (choice.logprobs.content if choice.logprobs else None) or []
            assert "".join(entry.token for entry in entries) == (choice.delta.content or "")
            text += choice.delta.content or ""
            tokens += [entry.token for entry in entries]
    else:
        (whole,) = client.chat.completions.create(messages=question, **params).choices
        text = whole.message.content or ""
        tokens = [
            entry.token for entry in (whole.logprobs.content if whole.logprobs else None) or []
        ]
    assert text == expected and "".join(tokens) == expected
    assert tokens[-1] == " P"


@pytest.fixture(scope="module")
def stock_v019_url(tmp_path_factory: pytest.TempPathFactory, text_env: Path) -> Iterator[str]:
    """SmolLM2 behind the stock v0.19.0 models (decoupled), the gateway in front."""
    from deploy.sidecar.models import ensure_smollm2
    from gateway.settings import ModelSettings, Settings
    from gateway.tenancy import TenancySettings
    from tests.support.stock import STOCK_MODELS, start_stock_sidecar

    if not STOCK_MODELS.is_dir():
        pytest.skip(f"the stock models are not beside the checkout ({STOCK_MODELS})")
    model_dir = ensure_smollm2()
    sidecar = start_stock_sidecar(
        "v0.19", True, model_dir, tmp_path_factory.mktemp("smol"), text_env=text_env
    )
    settings = Settings(
        models=(
            ModelSettings(
                name="smollm2",
                triton_url=sidecar.grpc_url,
                triton_model="ensemble",
                tokenizer_dir=str(model_dir),
            ),
        ),
        tenancy=TenancySettings(auth=False),
    )
    gateway = LiveGateway(settings).start()
    yield gateway.url
    gateway.stop()
    sidecar.stop()


def test_capital_of_france_through_the_stock_v019_ensemble(stock_v019_url: str) -> None:
    client = openai.OpenAI(base_url=f"{stock_v019_url}/v1", api_key="unused", max_retries=0)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    answer = client.chat.completions.create(
        model="smollm2", messages=question, temperature=0, max_tokens=30
    )
    text = answer.choices[0].message.content or ""
    assert "Paris" in text
    assert answer.usage is not None and 0 < answer.usage.completion_tokens <= 30
    stream = client.chat.completions.create(
        model="smollm2", messages=question, temperature=0, max_tokens=30, stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream) == text


def test_smollm2_with_a_lora_adapter_through_triton_gateway_serve(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """`triton-gateway serve` with its own sidecar: SmolLM2 plus a PEFT adapter made here gives
    Hugging Face + PEFT's greedy text, and the base model its own."""
    import signal

    from transformers import AutoTokenizer

    from deploy.sidecar.models import ensure_smollm2
    from tests.support.gateway import serve_process
    from tests.support.lora import AdapterRecipe, make_peft_adapter, peft_greedy

    model_dir = ensure_smollm2()
    workdir = tmp_path_factory.mktemp("smol-lora")
    recipe = AdapterRecipe(rank=8, alpha=16, targets=("q_proj", "v_proj", "down_proj"), seed=3,
                           std=0.15)  # fmt: skip
    adapter = make_peft_adapter(model_dir, workdir / "adapter", recipe)
    prompt = "The capital of France is"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer.encode(prompt)
    expected = {
        name: tokenizer.decode(peft_greedy(model_dir, folder, ids, 8))
        for name, folder in (("smollm2", None), ("smol-lora", adapter))
    }
    assert expected["smollm2"] != expected["smol-lora"]
    engine = {"kind": "torch", "model_dir": str(model_dir), "max_seq_len": 512}
    config = {
        "sidecars": {"inline": {"models": [{"name": "smol", "engine": engine}]}},
        "models": [
            {
                "name": "smollm2",
                "pipeline": "smol",
                "adapters": [{"name": "smol-lora", "path": str(adapter)}],
            }
        ],
        "tenancy": {"auth": False},
        "log_level": "WARNING",
    }
    url, process = serve_process(config, workdir, "gateway", timeout_s=300)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for model, text in expected.items():
            reply = client.completions.create(
                model=model, prompt=prompt, max_tokens=8, temperature=0.0
            )
            assert reply.choices[0].text == text, model
        parents = {m.id: m.model_extra.get("parent") for m in client.models.list().data}
        assert parents == {"smollm2": None, "smol-lora": "smollm2"}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def test_a_shared_system_prompt_is_prefilled_once(demo_url: str) -> None:
    """The demo turns KV-cache reuse on: the second question on the same system prompt finds it
    cached, and greedy answers are what they would be without the cache."""
    client = openai.OpenAI(base_url=f"{demo_url}/v1", api_key="unused", max_retries=0)
    system = (
        "You are a geography tutor. Answer in one short sentence, name the country, and never "
        "add anything else. Be precise about capitals, rivers and mountains. "
    ) * 4
    usages, answers = [], []
    for question in ("What is the capital of France?", "What is the capital of Italy?") * 2:
        reply = client.chat.completions.create(
            model=DEMO_MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            temperature=0,
            max_tokens=12,
        )
        usages.append(reply.usage)
        answers.append(reply.choices[0].message.content)
    details = [usage.prompt_tokens_details if usage else None for usage in usages]
    assert all(detail is not None for detail in details)
    cached = [detail.cached_tokens for detail in details if detail is not None]
    assert cached[0] == 0
    assert 32 * 4 <= cached[1] < usages[1].prompt_tokens  # the system prompt, not the question
    assert cached[2] == (usages[2].prompt_tokens - 1) // 32 * 32  # the whole first prompt
    assert answers[2] == answers[0] and answers[3] == answers[1]
    assert "Paris" in (answers[0] or "")
