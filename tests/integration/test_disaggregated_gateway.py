"""A model served disaggregated through the gateway, over two real tritonservers (the tiny
model's torch engine on the CPU): chat and completions answer what the same model answers whole,
streamed and not, the generation engine taking the prompt's KV cache from the context engine."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from deploy.sidecar.supervisor import Sidecar
from gateway.queueing.settings import QueueSettings
from gateway.replicas.settings import DisaggregationSettings
from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.integration.test_disaggregated_backend import ENGINE, PROMPT, servers
from tests.support.gateway import LiveGateway
from tests.support.prometheus import value
from tests.support.replica_gateway import FAST, endpoints

pytestmark = pytest.mark.slow
__all__ = ["servers"]

DISAGG = "nv_trt_llm_disaggregated_serving_metrics"


@pytest.fixture(scope="module")
def client(servers: Any, tiny_model_dir: Any) -> Iterator[openai.OpenAI]:
    context, generation = servers

    def model(name: str, **routing: Any) -> ModelSettings:
        return ModelSettings(
            name=name,
            triton_model=ENGINE,
            entry="tensorrt_llm",
            tokenizer_dir=str(tiny_model_dir),
            replicas=endpoints([generation]),
            routing=msgspec.structs.replace(FAST, **routing),
        )

    split = DisaggregationSettings(context_replicas=endpoints([context]), min_prompt_tokens=32)
    settings = Settings(
        models=(model("tiny-whole"), model("tiny-split", disaggregation=split)),
        limits=LimitSettings(request_timeout_s=60.0, shutdown_grace_s=5.0),
        tenancy=TenancySettings(auth=False),
        queueing=QueueSettings(enabled=False),
    )
    gateway = LiveGateway(settings)
    gateway.start()
    try:
        deadline = time.monotonic() + 60
        while httpx.get(f"{gateway.url}/health/ready", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "the gateway never became ready"
            time.sleep(0.1)
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as c:
            yield c
    finally:
        gateway.stop()


def _handoffs(server: Sidecar) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return value(text, DISAGG, model=ENGINE, disaggregated_serving_type="request_count")


def _eventually_above(server: Sidecar, count: float) -> None:
    deadline = time.monotonic() + 20
    while _handoffs(server) <= count:
        assert time.monotonic() < deadline, "the generation engine took no handoff"
        time.sleep(0.05)


def _answer(client: openai.OpenAI, model: str, endpoint: str, stream: bool, prompt: str) -> str:
    if endpoint == "chat":
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
        if stream:
            chunks = client.chat.completions.create(
                model=model, messages=messages, max_tokens=12, temperature=0, stream=True
            )
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=12, temperature=0
        )
        return answer.choices[0].message.content or ""
    if stream:
        pieces = client.completions.create(
            model=model, prompt=prompt, max_tokens=12, temperature=0, stream=True
        )
        return "".join(c.choices[0].text for c in pieces if c.choices)
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
    return whole.choices[0].text


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_split_answer_is_the_whole_answer(
    client: openai.OpenAI, servers: Any, endpoint: str, stream: bool
) -> None:
    _, generation = servers
    whole = _answer(client, "tiny-whole", endpoint, stream, PROMPT)
    before = _handoffs(generation)
    split = _answer(client, "tiny-split", endpoint, stream, PROMPT)
    assert split == whole and split
    _eventually_above(generation, before)


def test_each_pool_of_a_split_model_has_its_replica_metrics(client: openai.OpenAI) -> None:
    root = str(client.base_url).removesuffix("/").removesuffix("/v1")
    text = httpx.get(f"{root}/metrics", timeout=10).text
    assert value(text, "gateway_replica_up", model="tiny-split/context") == 1
    assert value(text, "gateway_replica_up", model="tiny-split") == 1
