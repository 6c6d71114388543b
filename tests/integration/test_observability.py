"""Spans, metrics, request ids and access lines of real requests through a real tritonserver."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from deploy.sidecar.supervisor import Sidecar
from gateway.observability.logs import JsonFormatter, RequestIdFilter
from tests.support.gateway import ENSEMBLE_MODEL, LiveGateway, sidecar_settings
from tests.support.prometheus import parse, scrape_until, total

pytestmark = pytest.mark.slow
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SECRET_PROMPT = "the launch code is 7391"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def traced(sidecar: Sidecar, tiny_model_dir: Path, exporter: InMemorySpanExporter) -> Iterator[str]:
    gateway = LiveGateway(sidecar_settings(sidecar, tiny_model_dir), span_exporter=exporter)
    yield gateway.start().url
    gateway.stop()


def _spans_of(exporter: InMemorySpanExporter, trace_id: int) -> dict[str, ReadableSpan]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        spans = {s.name: s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id}
        if "POST /v1/chat/completions" in spans or "POST /v1/completions" in spans:
            return spans
        time.sleep(0.05)
    raise AssertionError("the request's span was not exported")


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_is_one_trace_under_the_clients_traceparent(
    traced: str, exporter: InMemorySpanExporter, stream: bool
) -> None:
    body = {
        "model": ENSEMBLE_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "stream": stream,
        "stream_options": {"include_usage": True},
    }
    if not stream:
        del body["stream_options"]
    trace_id = f"{int(TRACE_ID, 16) + stream:032x}"
    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    with httpx.stream(
        "POST", f"{traced}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        lines = [line for line in response.iter_lines() if line]
    assert response.status_code == 200
    usage = json.loads(lines[-2][6:] if stream else lines[0])["usage"]

    spans = _spans_of(exporter, int(trace_id, 16))
    root = spans["POST /v1/chat/completions"]
    assert root.parent is not None and root.parent.span_id == 0x00F067AA0BA902B7
    for child in ("gateway.auth", "gateway.template", "gateway.rate_limit", "triton.generate"):
        assert spans[child].parent is not None, child
        assert spans[child].parent.span_id == root.context.span_id, child
    attributes = dict(root.attributes or {})
    assert attributes["gen_ai.request.model"] == ENSEMBLE_MODEL
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert attributes["http.response.status_code"] == 200
    assert attributes["gateway.tenant"]
    triton = spans["triton.generate"]
    assert [event.name for event in triton.events] == ["gen_ai.first_token"]
    assert dict(triton.attributes or {})["triton.model"] == "tiny_ensemble"


def test_request_ids_are_echoed_or_made(traced: str) -> None:
    given = httpx.get(f"{traced}/v1/models", headers={"X-Request-ID": "job-42"})
    assert given.headers["x-request-id"] == "job-42"
    made = httpx.get(f"{traced}/v1/models")
    assert len(made.headers["x-request-id"]) == 32
    unprintable = httpx.get(f"{traced}/v1/models", headers={"X-Request-ID": "a\tb"})
    assert unprintable.headers["x-request-id"] != "a\tb"
    forged = "job 1 tenant=team-a"
    replaced = httpx.get(f"{traced}/v1/models", headers={"X-Request-ID": forged})
    assert re.fullmatch(r"[0-9a-f]{32}", replaced.headers["x-request-id"])
    error = httpx.post(
        f"{traced}/v1/chat/completions", content=b"{", headers={"X-Request-ID": "e1"}
    )
    assert error.status_code == 400 and error.headers["x-request-id"] == "e1"


def test_metrics_follow_a_streamed_request(traced: str) -> None:
    model = {"model": ENSEMBLE_MODEL, "adapter": "", "tenant": "default"}
    before = httpx.get(f"{traced}/metrics").text
    client = openai.OpenAI(base_url=f"{traced}/v1", api_key="unused", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model=ENSEMBLE_MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            temperature=0,
        )
    )
    usage = chunks[-1].usage
    assert usage is not None
    route = {"route": "/v1/chat/completions", "method": "POST", "status": "200"}
    counted = total(before, "gateway_requests_total", **route) + 1
    after = scrape_until(
        lambda: httpx.get(f"{traced}/metrics").text, "gateway_requests_total", counted, **route
    )
    # Both expositions are ones Prometheus' own parser reads.
    assert all(list(text_string_to_metric_families(text)) for text in (before, after))

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    tenant = next(
        labels["tenant"]
        for name, labels, _ in parse(after)
        if name == "gateway_generation_requests_total"
    )
    model["tenant"] = tenant
    assert grew("gateway_generation_requests_total", status="200", **model) == 1
    assert grew("gateway_time_to_first_token_seconds_count", **model) == 1
    assert grew("gateway_e2e_request_latency_seconds_count", **model) == 1
    assert grew("gateway_request_queue_seconds_count", **model) == 1
    # A gap is counted between two of the engine's text events; the client's chunks may join
    # several events (backpressure), never split one.
    texts = sum(1 for chunk in chunks if chunk.choices and chunk.choices[0].delta.content)
    gaps = grew("gateway_inter_token_latency_seconds_count", **model)
    assert texts - 1 <= gaps <= usage.completion_tokens - 1
    assert grew("gateway_prompt_tokens_total", **model) == usage.prompt_tokens
    assert grew("gateway_completion_tokens_total", **model) == usage.completion_tokens
    assert grew("gateway_requests_total", **route) == 1


def test_metrics_name_each_models_transport_to_triton(traced: str, sidecar: Sidecar) -> None:
    exposed = [
        (labels, value)
        for name, labels, value in parse(httpx.get(f"{traced}/metrics").text)
        if name == "gateway_triton_transport_info"
    ]
    assert (
        {"model": ENSEMBLE_MODEL, "endpoint": sidecar.grpc_url, "transport": "grpc",
         "reason": "settings"},
        1.0,
    ) in exposed  # fmt: skip


def test_access_line_has_the_facts_and_not_the_prompt(
    traced: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        answer = httpx.post(
            f"{traced}/v1/completions",
            json={"model": ENSEMBLE_MODEL, "prompt": SECRET_PROMPT, "max_tokens": 4},
            headers={"X-Request-ID": "access-1"},
            timeout=30,
        )
        time.sleep(0.2)
    assert answer.status_code == 200
    lines = [
        r for r in caplog.records if r.name == "gateway.access" and "completions" in r.getMessage()
    ]
    line = lines[-1]
    assert line.__dict__["status"] == 200 and line.__dict__["model"] == ENSEMBLE_MODEL
    assert line.__dict__["completion_tokens"] == answer.json()["usage"]["completion_tokens"]
    assert line.__dict__["prompt_tokens"] == answer.json()["usage"]["prompt_tokens"]
    assert "ttft_ms" in line.__dict__ and "duration_ms" in line.__dict__
    assert all(
        SECRET_PROMPT not in r.getMessage() for r in caplog.records if r.levelno >= logging.INFO
    )

    RequestIdFilter().filter(line)
    entry = json.loads(JsonFormatter().format(line))
    assert entry["logger"] == "gateway.access" and entry["status"] == 200
    assert entry["request_id"] == "access-1"
    assert entry["model"] == ENSEMBLE_MODEL
