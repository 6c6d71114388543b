"""The phases of disaggregated requests observed: whether each request ran split or whole and
why, how each phase ended, the handoff's time between the phases, and a span per phase naming
the replica that ran it."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span, Status, StatusCode
from prometheus_client import CollectorRegistry, Counter, Histogram

HANDOFF_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class PhaseMetrics:
    """``gateway_disaggregated_*``: labels are the model's name and fixed words."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "gateway_disaggregated_requests",
            "Requests of a disaggregated model, by how they ran: split, or whole and why "
            "(whole_short_prompt, whole_beam_search, whole_images, whole_no_prompt_ids).",
            ["model", "decision"],
            registry=registry,
        )
        self.phases = Counter(
            "gateway_disaggregated_phases",
            "Phases of split requests by phase (context, generation) and outcome: answered, "
            "failed, cancelled (the client left), handoff_lost (the generation phase failed "
            "before anything reached the client: the request ran again whole), ended_in_band "
            "(it failed after the first token was streamed).",
            ["model", "phase", "outcome"],
            registry=registry,
        )
        self.handoff = Histogram(
            "gateway_disaggregated_handoff_seconds",
            "Time from a streamed split request's context answer to the first response of its "
            "generation phase (the wait for a generation slot, the KV-cache transfer and one "
            "decoding step).",
            ["model"],
            buckets=HANDOFF_BUCKETS,
            registry=registry,
        )


def name_replica(span: Span, name: str, address: str) -> None:
    """Record on ``span`` the replica ``name`` at ``address`` (``host:port``) it went to."""
    if not span.is_recording():
        return
    host, _, port = address.rpartition(":")
    span.set_attribute("triton.replica", name)
    span.set_attribute("server.address", host.strip("[]"))
    if port.isdigit():
        span.set_attribute("server.port", int(port))


class PhaseWatch:
    """One phase of a split request: its span (under the request's ``triton.generate`` span),
    the replicas its attempts went to, and how it ended."""

    def __init__(
        self,
        metrics: PhaseMetrics,
        span: Span,
        model: str,
        phase: str,
        trace_headers: dict[str, str],
    ) -> None:
        self._metrics = metrics
        self.span = span
        self._model = model
        self._phase = phase
        self._trace_headers = trace_headers
        self._ended = False

    def trace_headers(self) -> dict[str, str]:
        """Trace context for the gRPC metadata of the phase's Triton call (its span's)."""
        return dict(self._trace_headers)

    def replica(self, name: str, address: str) -> None:
        """An attempt of the phase went to replica ``name`` at ``address``."""
        name_replica(self.span, name, address)

    def failover(self, name: str, error: BaseException) -> None:
        """The attempt on ``name`` failed before its answer; another replica is tried."""
        if self.span.is_recording():
            self.span.add_event(
                "gateway.failover", {"triton.replica": name, "error.type": type(error).__name__}
            )

    def ended(self, outcome: str, error: BaseException | None = None) -> None:
        """The phase ended with ``outcome`` (once; later calls are ignored)."""
        if self._ended:
            return
        self._ended = True
        self._metrics.phases.labels(self._model, self._phase, outcome).inc()
        span = self.span
        span.set_attribute("gateway.outcome", outcome)
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()


def phase_attributes(model: str, phase: str) -> dict[str, Any]:
    """The attributes a phase's span starts with."""
    return {"gateway.phase": phase, "gen_ai.request.model": model}
