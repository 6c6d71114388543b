"""Pure parts of observability: trace context hand-off, usage counting, request ids."""

from __future__ import annotations

import logging
import re

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.observability import Observability, ObservabilitySettings, request_id_from
from gateway.observability.record import (
    RequestRecord,
    Tracing,
    TracingSettings,
    current_request,
)

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_with_tracing_off_only_a_valid_context_is_passed_on() -> None:
    tracing = Tracing(TracingSettings())
    span = tracing.child(None, "triton.generate", SpanKind.CLIENT, {})
    assert tracing.outgoing(span, {"traceparent": PARENT}) == {"traceparent": PARENT}
    sent = tracing.outgoing(span, {"traceparent": PARENT, "tracestate": "vendor=\u00e9t\u00e9"})
    assert sent == {"traceparent": PARENT}
    assert tracing.outgoing(span, {"traceparent": "garbage"}) == {}


def test_prompt_tokens_count_once_per_prompt_and_errors_mark_the_span() -> None:
    exporter = InMemorySpanExporter()
    observability = Observability(ObservabilitySettings(), span_exporter=exporter)
    record = RequestRecord("r1", "POST", "/v1/completions", model="m", tenant="t")
    record.span = observability.tracing.start_request("POST /v1/completions", {}, {})
    token = current_request.set(record)
    try:
        watch = observability.generation({})
        watch.ended(0, 10, 3)
        watch.ended(0, 10, 4)  # a second choice of the same prompt
        watch.ended(1, 6, 2)
        watch.close(RuntimeError("backend failed"))
    finally:
        current_request.reset(token)
    assert (record.prompt_tokens, record.completion_tokens) == (16, 9)
    labels = {"model": "m", "adapter": "", "tenant": "t"}
    registry = observability.metrics.registry
    assert registry.get_sample_value("gateway_prompt_tokens_total", labels) == 16
    assert registry.get_sample_value("gateway_completion_tokens_total", labels) == 9
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "triton.generate"]
    assert span.status.status_code == StatusCode.ERROR


def test_request_ids() -> None:
    assert request_id_from({"x-request-id": "abc-1"}) == "abc-1"
    assert request_id_from({"x-request-id": "x" * 129}) != "x" * 129
    assert request_id_from({"x-request-id": "caf\u00e9"}) != "caf\u00e9"
    assert len(request_id_from({})) == 32


@pytest.mark.parametrize(
    "given",
    ["job 1 tenant=team-a", "a\tb", "x" * 129, "caf\u00e9", "", 'say"so', "a\nb", "k=v"],
)
def test_a_request_id_outside_the_safe_form_is_replaced_and_logged_escaped(
    given: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="gateway.observability"):
        generated = request_id_from({"x-request-id": given})
    assert generated != given and re.fullmatch(r"[0-9a-f]{32}", generated)
    (logged,) = caplog.records
    line = logged.getMessage()
    assert ascii(given) in line and generated in line and "\n" not in line


@pytest.mark.parametrize("given", ["job-42", "a.b:c_d-e", "x" * 128, "01HV3Z9:retry.2"])
def test_a_safe_request_id_is_kept(given: str) -> None:
    assert request_id_from({"x-request-id": given}) == given


def test_each_phase_of_a_split_request_is_a_span_and_counted() -> None:
    exporter = InMemorySpanExporter()
    observability = Observability(ObservabilitySettings(), span_exporter=exporter)
    record = RequestRecord("r1", "POST", "/v1/completions", model="m", tenant="t")
    record.span = observability.tracing.start_request("POST /v1/completions", {}, {})
    token = current_request.set(record)
    try:
        watch = observability.generation({})
        watch.decided("m", "split")
        context = watch.phase("m", "context")
        context.replica("ctx-0", "10.0.0.1:8001")
        context.ended("answered")
        context.ended("failed")  # a phase ends once
        generation = watch.phase("m", "generation")
        headers = generation.trace_headers()
        watch.handed_over("m", 0.02)
        generation.ended("handoff_lost", RuntimeError("the context engine holds no request"))
        watch.close()
    finally:
        current_request.reset(token)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    generate = spans["triton.generate"]
    assert dict(generate.attributes or {})["gateway.disaggregation"] == "split"
    for name in ("triton.context", "triton.generation"):
        parent = spans[name].parent
        assert parent is not None and generate.context is not None
        assert parent.span_id == generate.context.span_id
    assert dict(spans["triton.context"].attributes or {})["triton.replica"] == "ctx-0"
    assert dict(spans["triton.context"].attributes or {})["server.port"] == 8001
    assert spans["triton.generation"].status.status_code == StatusCode.ERROR
    # The generation phase's Triton call is traced under its own span.
    own = spans["triton.generation"].context
    assert own is not None and f"{own.span_id:016x}" in headers["traceparent"]
    registry = observability.metrics.registry

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"model": "m", **labels})

    assert sample("gateway_disaggregated_requests_total", decision="split") == 1
    phases = "gateway_disaggregated_phases_total"
    assert sample(phases, phase="context", outcome="answered") == 1
    assert sample(phases, phase="context", outcome="failed") is None
    assert sample(phases, phase="generation", outcome="handoff_lost") == 1
    assert sample("gateway_disaggregated_handoff_seconds_count") == 1


async def test_with_tracing_off_a_request_without_trace_context_runs_none_of_the_tracer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tracer ran with tracing off")

    for method in ("start_request", "step", "child", "outgoing"):
        monkeypatch.setattr(Tracing, method, refused)
    observability = Observability(ObservabilitySettings())
    seen: list[dict[str, str]] = []

    async def app(scope: object, receive: object, send: object) -> None:
        with observability.step("gateway.auth"):
            watch = observability.generation({"triton.model": "m"})
        seen.append(watch.trace_headers())
        watch.close()

    observe = observability.middleware(lambda: None, lambda: None)(app)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    await observe(scope, None, None)  # type: ignore[arg-type]
    assert seen == [{}]
