"""Observability: Prometheus metrics, OpenTelemetry spans, request ids and access logs.

The request path calls three things: the ASGI middleware (``Observability.middleware``) opens a
``RequestRecord`` and the request's span; a route names the model and tenant once it knows them
(``Observability.serving``); the generation service watches the events of the Triton call
(``Observability.generation``). The record then yields the access line, the metrics and the
span's attributes when the answer ends.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgspec
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

from gateway.ids import random_hex
from gateway.observability.logs import LogFormat, configure_logging, log_access
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.phases import PhaseMetrics, PhaseWatch, name_replica, phase_attributes
from gateway.observability.record import (
    PROPAGATED,
    RequestRecord,
    Tracing,
    TracingSettings,
    current_request,
    finish_request,
)

__all__ = [
    "GatewayMetrics",
    "GenerationWatch",
    "MetricsSettings",
    "Observability",
    "ObservabilitySettings",
    "RequestRecord",
    "TracingSettings",
    "configure_logging",
    "current_request",
    "request_id_from",
]
REQUEST_ID_HEADER = "x-request-id"
SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""The client ids taken as they are: no spaces, ``=`` or quotes, so one cannot write fields of
its own (``tenant=team-a``) into a log line or change the Triton request id's shape."""
logger = logging.getLogger(__name__)


class MetricsSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Who may read ``/metrics`` and ``/metrics/sidecars/<name>``, and on which port."""

    auth: Literal["auto", "none", "admin"] = "auto"
    """``auto``: the admin key, as a bearer token, whenever one is set or tenants' keys are
    checked (tenant names are label values; with no admin key the metrics are then refused),
    else anyone; ``admin``: only the admin key; ``none``: anyone who reaches the port."""
    port: int | None = None
    """A port of their own for the metrics (the API port then has none); unset: the API port."""
    host: str | None = None
    """Address the metrics port binds; defaults to ``server.host``."""


class ObservabilitySettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Log format, tracing, and access to the Prometheus metrics."""

    log_format: LogFormat = "text"
    """``text``, or ``json``: one object per line with the request id and the access fields."""
    tracing: TracingSettings = TracingSettings()
    """OpenTelemetry spans, exported over OTLP/HTTP."""
    metrics: MetricsSettings = MetricsSettings()
    """Who may read the metrics, and on which port."""


class GenerationWatch:
    """One request's Triton call: its span, queue time, first token, token gaps and usage."""

    def __init__(
        self, owner: Observability, record: RequestRecord | None, span: Span, *, sent: bool = True
    ) -> None:
        self._owner = owner
        self._record = record
        self.span = span
        self._last: dict[int, float] = {}
        self._prompts: dict[int, int] = {}
        self._gaps = owner.metrics.token_gaps(record) if record is not None else None
        if sent:
            self.sent()

    def sent(self) -> None:
        """The request's admission was answered (its call goes to Triton now, or went ahead
        of the answer): the request's queue time."""
        record = self._record
        if record is not None and record.queue_s is None:
            record.queue_s = time.monotonic() - record.start
            self._owner.metrics.record_queue(record)

    def replica(self, name: str, address: str) -> None:
        """The call went to replica ``name`` at ``address`` (``host:port``) of the model."""
        name_replica(self.span, name, address)

    def decided(self, model: str, decision: str) -> None:
        """A request of the disaggregated ``model`` runs split, or whole (``decision`` says
        why)."""
        self._owner.phase_metrics.requests.labels(model, decision).inc()
        if self.span.is_recording():
            self.span.set_attribute("gateway.disaggregation", decision)

    def phase(self, model: str, phase: str) -> PhaseWatch:
        """Start watching one phase (``context``, ``generation``) of a split request."""
        tracing = self._owner.tracing
        span = tracing.child(
            self.span, f"triton.{phase}", SpanKind.CLIENT, phase_attributes(model, phase)
        )
        incoming = self._record.trace_headers if self._record is not None else {}
        return PhaseWatch(
            self._owner.phase_metrics, span, model, phase, tracing.outgoing(span, incoming)
        )

    def handed_over(self, model: str, seconds: float) -> None:
        """A split request's generation phase answered ``seconds`` after its context phase."""
        self._owner.phase_metrics.handoff.labels(model).observe(seconds)

    def failover(self, name: str, error: BaseException) -> None:
        """The call failed on replica ``name`` before its first token; another is tried."""
        if self.span.is_recording():
            self.span.add_event(
                "gateway.failover",
                {"triton.replica": name, "error.type": type(error).__name__},
            )

    def trace_headers(self) -> dict[str, str]:
        """Trace context for the gRPC metadata of the Triton call: none with tracing off and
        none from the client."""
        incoming = self._record.trace_headers if self._record is not None else {}
        tracing = self._owner.tracing
        return tracing.outgoing(self.span, incoming) if tracing.enabled or incoming else {}

    def text(self, index: int) -> None:
        """Choice ``index`` produced text."""
        now = time.monotonic()
        record = self._record
        if record is not None and record.first_token_s is None:
            record.first_token_s = now - record.start
            self._owner.metrics.record_first_token(record)
            self.span.add_event("gen_ai.first_token")
        last = self._last.get(index)
        if self._gaps is not None and last is not None:
            self._gaps.add(now - last)
        self._last[index] = now

    def ended(
        self, prompt_index: int, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
    ) -> None:
        """A choice ended with these token counts (choices of one prompt share its tokens, and
        the engine's cache of them)."""
        record = self._record
        if record is None:
            return
        first = prompt_index not in self._prompts
        self._owner.metrics.record_tokens(record, prompt_tokens if first else 0, completion_tokens)
        if first and cached_tokens:
            self._owner.metrics.record_cached_tokens(record, cached_tokens)
        self._prompts[prompt_index] = prompt_tokens
        record.prompt_tokens = sum(self._prompts.values())
        record.completion_tokens += completion_tokens

    def cut_short(self, prompts: Mapping[int, int], completion_tokens: int) -> None:
        """The call ended before some choices did (the client left, a failure, a timeout):
        ``prompts`` the tokens of every prompt the engine took, ``completion_tokens`` what the
        unfinished choices generated. Counted like ended choices, prompts not yet counted once."""
        record = self._record
        if record is None:
            return
        fresh = {index: count for index, count in prompts.items() if index not in self._prompts}
        if not fresh and not completion_tokens:
            return
        self._owner.metrics.record_tokens(record, sum(fresh.values()), completion_tokens)
        self._prompts.update(fresh)
        record.prompt_tokens = sum(self._prompts.values())
        record.completion_tokens += completion_tokens

    def close(self, error: BaseException | None = None) -> None:
        """The call ended (normally, failed, or cancelled by the client leaving)."""
        try:
            if isinstance(error, Exception):
                self.span.record_exception(error)
                self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            elif error is not None:
                self.span.set_attribute("gateway.cancelled", True)
            self.span.end()
        finally:
            if self._gaps is not None:
                self._gaps.flush()


class Observability:
    """Metrics, tracing and access logs of one app."""

    def __init__(
        self, settings: ObservabilitySettings, *, span_exporter: SpanExporter | None = None
    ) -> None:
        self.settings = settings
        self.metrics = GatewayMetrics()
        self.phase_metrics = PhaseMetrics(self.metrics.registry)
        self.tracing = Tracing(settings.tracing, span_exporter)

    def serving(self, model: str, adapter: str | None, tenant: str, operation: str) -> None:
        """The current request goes to ``model`` (``adapter`` on it) for ``tenant``."""
        record = current_request.get()
        if record is None:
            return
        record.model, record.adapter, record.tenant = model, adapter or "", tenant
        if record.span is not None and record.span.is_recording():
            record.span.set_attributes(
                {
                    "gen_ai.operation.name": operation,
                    "gen_ai.request.model": adapter or model,
                    "gen_ai.system": "triton",
                }
            )

    def step(self, name: str) -> Any:
        """A child span of the current request (templating, authentication, admission)."""
        return self.tracing.step(name) if self.tracing.enabled else contextlib.nullcontext()

    def generation(self, attributes: dict[str, Any], *, sent: bool = True) -> GenerationWatch:
        """Start watching the current request's Triton call (sent now, or at ``sent()``)."""
        record = current_request.get()
        span: Span = INVALID_SPAN
        if self.tracing.enabled and record is not None:
            span = self.tracing.child(record.span, "triton.generate", SpanKind.CLIENT, attributes)
        return GenerationWatch(self, record, span, sent=sent)

    def middleware(
        self, on_start: Callable[[], None], on_end: Callable[[], None]
    ) -> Callable[[ASGIApp], ASGIApp]:
        """ASGI middleware: request id, root span, in-flight count, metrics and access line."""

        def wrap(app: ASGIApp) -> ASGIApp:
            async def observe(scope: Scope, receive: Receive, send: Send) -> None:
                if scope["type"] != ScopeType.HTTP:
                    await app(scope, receive, send)
                    return
                headers = {
                    key.decode("latin-1").lower(): value.decode("latin-1")
                    for key, value in scope.get("headers", ())
                }
                record = self._open(scope, headers)
                echo = (REQUEST_ID_HEADER.encode(), record.request_id.encode())

                async def capture(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        record.status = message["status"]
                        message["headers"] = [*message.get("headers", ()), echo]
                    await send(message)

                token = current_request.set(record)
                on_start()
                self.metrics.in_flight.inc()
                try:
                    await app(scope, receive, capture)
                except BaseException as exc:
                    record.error = type(exc).__name__
                    raise
                finally:
                    self.metrics.in_flight.dec()
                    on_end()
                    self._close(record)
                    current_request.reset(token)

            return observe

        return wrap

    def _open(self, scope: Scope, headers: dict[str, str]) -> RequestRecord:
        method = str(scope.get("method", ""))
        route = str(scope.get("path_template") or "other")
        record = RequestRecord(request_id_from(headers), method, route)
        record.trace_headers = {k: v for k, v in headers.items() if k in PROPAGATED}
        if not self.tracing.enabled:
            record.span = INVALID_SPAN
            return record
        record.span = self.tracing.start_request(
            f"{method} {route}",
            headers,
            {
                "http.request.method": method,
                "http.route": route,
                "url.path": str(scope.get("path", "")),
                "gateway.request_id": record.request_id,
            },
        )
        return record

    def _close(self, record: RequestRecord) -> None:
        seconds = time.monotonic() - record.start
        self.metrics.record_request(record, seconds)
        finish_request(record)
        log_access(record, seconds)

    def close(self) -> None:
        """Flush the span exporter."""
        self.tracing.close()


def request_id_from(headers: dict[str, str]) -> str:
    """The client's ``X-Request-ID`` when ``SAFE_REQUEST_ID`` matches all of it, else a new one
    (the refused value is logged escaped, and shortened)."""
    given = headers.get(REQUEST_ID_HEADER)
    if given is not None and SAFE_REQUEST_ID.fullmatch(given):
        return given
    generated = random_hex(16)
    if given is not None:
        logger.info(
            "X-Request-ID %s refused (allowed: %s); request id %s instead",
            ascii(given[:256]),
            SAFE_REQUEST_ID.pattern,
            generated,
        )
    return generated
