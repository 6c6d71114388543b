"""One request as observed: its record (what the request path learns about it, for its log line,
metrics and span) and its trace.

With tracing off, a request that brings no trace context runs none of the trace's code: the
request path reads ``Tracing.enabled`` first (``gateway.observability``).

The trace is OpenTelemetry's: a span per HTTP request, children for its steps, context to
Triton. The W3C ``traceparent`` of the client is the parent of the request's span; the Triton
call's context goes into the gRPC metadata, so a tritonserver started with
``--trace-config mode=opentelemetry`` puts its own spans in the same trace. With tracing off
the client's ``traceparent`` is still passed on to Triton unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class RequestRecord:
    """One HTTP request as observed: set by the middleware, filled in by the request path."""

    request_id: str
    method: str
    route: str
    start: float = field(default_factory=time.monotonic)
    model: str = ""
    adapter: str = ""
    tenant: str = ""
    status: int = 500
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_s: float | None = None
    queue_s: float | None = None
    error: str = ""
    trace_headers: dict[str, str] = field(default_factory=dict)
    """The client's W3C trace context headers."""
    span: Any = None
    """The request's root span (a no-op span when tracing is off)."""

    @property
    def generates(self) -> bool:
        """Whether the request reached a model (completion routes past model lookup)."""
        return bool(self.model)


current_request: ContextVar[RequestRecord | None] = ContextVar("gateway_request", default=None)
"""The record of the request being answered in this context, if any (set by the middleware)."""


PROPAGATED = ("traceparent", "tracestate")
_propagator = TraceContextTextMapPropagator()


class TracingSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """OTLP export of the gateway's spans; off unless ``enabled``."""

    enabled: bool = False
    """Export a span per request, with children for auth, templating, limits and the Triton call."""
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    """OTLP/HTTP traces endpoint of a collector."""
    headers: dict[str, str] = {}
    """Headers sent with every export (an ingest key, say)."""
    service_name: str = "triton-gateway"
    """``service.name`` of the exported spans' resource."""
    sample_ratio: float = 1.0
    """Share of new traces recorded; a client's sampled ``traceparent`` is always followed."""


class Tracing:
    """The app's tracer and how the request path opens spans and hands context to Triton."""

    def __init__(self, settings: TracingSettings, exporter: SpanExporter | None = None) -> None:
        self.settings = settings
        self.enabled = settings.enabled or exporter is not None
        """Whether spans are recorded."""
        self.provider: TracerProvider | None = None
        if self.enabled:
            self.provider = TracerProvider(
                resource=Resource.create({"service.name": settings.service_name}),
                sampler=ParentBasedTraceIdRatio(settings.sample_ratio),
            )
            self.provider.add_span_processor(_processor(settings, exporter))
            self.tracer: trace.Tracer = self.provider.get_tracer("triton-gateway")
        else:
            self.tracer = trace.NoOpTracer()

    def start_request(
        self, name: str, headers: Mapping[str, str], attributes: dict[str, Any]
    ) -> Span:
        """The root span of an HTTP request, child of the client's ``traceparent`` if any."""
        if not self.enabled:
            return trace.INVALID_SPAN
        parent = _propagator.extract(dict(headers))
        return self.tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, attributes=attributes
        )

    @contextmanager
    def step(self, name: str, kind: SpanKind = SpanKind.INTERNAL) -> Iterator[Span]:
        """A child span of the current request's span (a no-op outside requests)."""
        record = current_request.get()
        if record is None or record.span is None or not self.enabled:
            yield trace.INVALID_SPAN
            return
        parent = trace.set_span_in_context(record.span)
        with self.tracer.start_as_current_span(name, context=parent, kind=kind) as span:
            yield span

    def child(
        self, parent: Span | None, name: str, kind: SpanKind, attributes: dict[str, Any]
    ) -> Span:
        """A span under ``parent`` that the caller ends (no-op when off or without a parent)."""
        if parent is None or not self.enabled:
            return trace.INVALID_SPAN
        context = trace.set_span_in_context(parent)
        return self.tracer.start_span(name, context=context, kind=kind, attributes=attributes)

    def outgoing(self, span: Span, headers: Mapping[str, str]) -> dict[str, str]:
        """Trace headers for the Triton call made under ``span``; the client's when off."""
        carrier: dict[str, str] = {}
        if not self.enabled:
            if not headers:
                return carrier
            # Re-encoded, so only a valid W3C context (printable ASCII) reaches gRPC metadata.
            _propagator.inject(carrier, context=_propagator.extract(dict(headers)))
            return carrier
        _propagator.inject(carrier, context=trace.set_span_in_context(span, otel_context.Context()))
        return carrier

    def close(self) -> None:
        """Flush and stop the exporter."""
        if self.provider is not None:
            self.provider.shutdown()


def _processor(settings: TracingSettings, exporter: SpanExporter | None) -> SpanProcessor:
    if exporter is not None:
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        return SimpleSpanProcessor(exporter)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(
        OTLPSpanExporter(endpoint=settings.endpoint, headers=settings.headers)
    )


def finish_request(record: RequestRecord) -> None:
    """Close the request's span with its outcome and the GenAI usage attributes."""
    span = record.span
    if span is None or not span.is_recording():
        return
    span.set_attribute("http.response.status_code", record.status)
    if record.generates:
        span.set_attributes(
            {
                "gen_ai.usage.input_tokens": record.prompt_tokens,
                "gen_ai.usage.output_tokens": record.completion_tokens,
                "gateway.tenant": record.tenant,
                "gateway.adapter": record.adapter,
            }
        )
    if record.status >= 500:
        span.set_status(Status(StatusCode.ERROR, record.error or None))
    span.end()
