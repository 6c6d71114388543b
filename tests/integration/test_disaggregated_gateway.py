"""A model served disaggregated through the gateway, over two real tritonservers (the tiny
model's torch engine on the CPU): chat and completions answer what the same model answers whole,
streamed and not, tool calls included, the generation engine taking the prompt's KV cache from
the context engine; a repeated prompt reuses its prefix on both sides; the phases are counted
and traced."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deploy.sidecar.supervisor import Sidecar
from gateway.queueing.settings import QueueSettings
from gateway.replicas.settings import DisaggregationSettings
from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.integration.test_disaggregated_backend import (
    BLOCKS,
    ENGINE,
    PROMPT,
    disaggregated_servers,
)
from tests.support.gateway import LiveGateway
from tests.support.prometheus import parse, total, value
from tests.support.replica_gateway import FAST, endpoints

pytestmark = pytest.mark.slow

DISAGG = "nv_trt_llm_disaggregated_serving_metrics"
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    }
]


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A context and a generation server whose engines take guided decoding (tool calls)."""
    work = tmp_path_factory.mktemp("disagg-gateway")
    with disaggregated_servers(tiny_model_dir, work, guided_decoding=True) as both:
        yield both


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def client(
    servers: Any, tiny_model_dir: Path, exporter: InMemorySpanExporter
) -> Iterator[openai.OpenAI]:
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
    # Both servers in the context pool: a prompt's context phase goes where its prefix is.
    both = DisaggregationSettings(
        context_replicas=endpoints([context, generation]), min_prompt_tokens=32
    )
    settings = Settings(
        models=(
            model("tiny-whole"),
            model("tiny-split", disaggregation=split),
            model("tiny-split-both", disaggregation=both, prefix_block_tokens=16),
        ),
        limits=LimitSettings(request_timeout_s=60.0, shutdown_grace_s=5.0),
        tenancy=TenancySettings(auth=False),
        queueing=QueueSettings(enabled=False),
    )
    gateway = LiveGateway(settings, span_exporter=exporter)
    gateway.start()
    try:
        gateway.wait_ready()
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as c:
            yield c
    finally:
        gateway.stop()


def _engine(server: Sidecar) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        return str(response.read().decode())


def _handoffs(server: Sidecar) -> float:
    return value(_engine(server), DISAGG, model=ENGINE, disaggregated_serving_type="request_count")


def _reused(server: Sidecar) -> float:
    """Prompt blocks the engine found in its cache since it started."""
    return value(_engine(server), BLOCKS, model=ENGINE, kv_cache_block_type="reused")


def _eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


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


def _gateway_metrics(client: openai.OpenAI) -> str:
    root = str(client.base_url).removesuffix("/").removesuffix("/v1")
    return httpx.get(f"{root}/metrics", timeout=10).text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_split_tool_call_is_the_whole_tool_call(
    client: openai.OpenAI, servers: Any, stream: bool
) -> None:
    _, generation = servers
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "What is the weather in Paris? " * 6}
    ]

    def call(model: str) -> list[tuple[str, str]]:
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "tools": TOOLS,
            "tool_choice": "required",
            "max_tokens": 200,
            "temperature": 0,
        }
        if not stream:
            answer = client.chat.completions.create(**kwargs)
            calls = answer.choices[0].message.tool_calls or []
            return [(c.function.name, c.function.arguments) for c in calls]
        names: dict[int, str] = {}
        arguments: dict[int, str] = {}
        for chunk in client.chat.completions.create(**kwargs, stream=True):
            for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                if delta.function is not None:
                    names[delta.index] = names.get(delta.index, "") + (delta.function.name or "")
                    arguments[delta.index] = arguments.get(delta.index, "") + (
                        delta.function.arguments or ""
                    )
        return [(names[index], arguments[index]) for index in sorted(names)]

    whole = call("tiny-whole")
    before = _handoffs(generation)
    split = call("tiny-split")
    assert split == whole
    assert split and all(name == "get_weather" for name, _ in split)
    assert all(json.loads(arguments)["unit"] in ("celsius", "fahrenheit") for _, arguments in split)
    _eventually_above(generation, before)


def test_a_repeated_prompt_reuses_its_prefix_on_both_sides(
    client: openai.OpenAI, servers: Any
) -> None:
    context, generation = servers
    prompt = "A prompt of its own, repeated to show prefix reuse on both sides. " * 4 + PROMPT
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]

    def ask() -> tuple[str, int, int]:
        answer = client.chat.completions.create(
            model="tiny-split", messages=messages, max_tokens=6, temperature=0
        )
        usage = answer.usage
        assert usage is not None
        details = usage.prompt_tokens_details
        cached = details.cached_tokens if details is not None else None
        return answer.choices[0].message.content or "", usage.prompt_tokens, cached or 0

    handoffs = _handoffs(context), _handoffs(generation)
    first, prompt_tokens, cached_first = ask()
    # Both engines published the first request's statistics.
    _eventually_above(context, handoffs[0])
    _eventually_above(generation, handoffs[1])
    blocks = prompt_tokens // 16
    reused = _reused(context), _reused(generation)
    again, _, cached_again = ask()
    assert again == first
    # The context engine took the prompt's full blocks from its cache; so did the generation
    # engine, which kept them from the first handoff and took only the rest from the context
    # engine.
    _eventually(lambda: _reused(context) - reused[0] >= blocks - 1, "no reuse in context")
    _eventually(lambda: _reused(generation) - reused[1] >= blocks - 1, "no reuse in generation")
    assert cached_again >= (blocks - 1) * 16 > cached_first


def test_the_context_phase_goes_to_the_context_replica_that_caches_its_prefix(
    client: openai.OpenAI,
) -> None:
    pool = "tiny-split-both/context"

    def routed(text: str) -> dict[str, float]:
        return {
            labels["replica"]: number
            for name, labels, number in parse(text)
            if name == "gateway_replica_requests_total" and labels["model"] == pool
        }

    before = _gateway_metrics(client)
    prompt = "Its own prefix, to find the context replica that caches it. " * 3 + PROMPT
    answers = [_answer(client, "tiny-split-both", "completions", False, prompt) for _ in range(3)]
    after = _gateway_metrics(client)
    assert len(set(answers)) == 1
    # Every context phase went to the one replica that prefilled the prompt first.
    added = {name: count - routed(before).get(name, 0.0) for name, count in routed(after).items()}
    assert sorted(added.values()) == [0.0, 3.0]
    hits = total(after, "gateway_replica_prefix_hits_total", model=pool)
    assert hits - total(before, "gateway_replica_prefix_hits_total", model=pool) == 2


def test_the_split_and_whole_requests_are_counted_by_how_they_ran(
    client: openai.OpenAI,
) -> None:
    before = _gateway_metrics(client)

    def count(text: str, family: str, **labels: str) -> float:
        return total(text, family, model="tiny-split", **labels)

    _answer(client, "tiny-split", "completions", True, PROMPT)
    _answer(client, "tiny-split", "completions", False, "A short prompt")
    after = _gateway_metrics(client)
    requests = "gateway_disaggregated_requests_total"
    assert count(after, requests, decision="split") == count(before, requests, decision="split") + 1
    short = {"decision": "whole_short_prompt"}
    assert count(after, requests, **short) == count(before, requests, **short) + 1
    phases = "gateway_disaggregated_phases_total"
    for phase in ("context", "generation"):
        answered = {"phase": phase, "outcome": "answered"}
        assert count(after, phases, **answered) == count(before, phases, **answered) + 1
    handoffs = "gateway_disaggregated_handoff_seconds_count"
    assert count(after, handoffs) == count(before, handoffs) + 1
    # The engines' own handoff counts, as the gateway scraped them from each replica.
    replica_handoffs = total(after, "gateway_replica_kv_handoffs", model="tiny-split")
    assert replica_handoffs >= 1


def _spans(exporter: InMemorySpanExporter, trace_id: int) -> dict[str, ReadableSpan]:
    deadline = time.monotonic() + 20
    while True:
        spans = {s.name: s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id}
        if "POST /v1/completions" in spans:
            return spans
        assert time.monotonic() < deadline, "the request's span was not exported"
        time.sleep(0.05)


def test_each_phase_is_a_span_naming_its_replica(
    client: openai.OpenAI, exporter: InMemorySpanExporter
) -> None:
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4736"
    client.completions.create(
        model="tiny-split",
        prompt=PROMPT,
        max_tokens=4,
        temperature=0,
        extra_headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
    )
    spans = _spans(exporter, int(trace_id, 16))
    root, generate = spans["POST /v1/completions"], spans["triton.generate"]
    assert generate.parent is not None and generate.parent.span_id == root.context.span_id
    for phase, replica in (("context", "context"), ("generation", "generation")):
        span = spans[f"triton.{phase}"]
        assert span.parent is not None and span.parent.span_id == generate.context.span_id
        attributes = dict(span.attributes or {})
        assert attributes["triton.replica"] == replica
        assert attributes["gateway.phase"] == phase
        assert attributes["gateway.outcome"] == "answered"
    assert dict(generate.attributes or {})["gateway.disaggregation"] == "split"
