"""Prometheus metrics on a per-app registry.

Label values come only from configuration (routes, model and adapter names, tenant names, limit
names, sidecar names), so the number of series stays bounded whatever clients send. With
several worker processes (``PROMETHEUS_MULTIPROC_DIR`` set before prometheus_client is
imported) every process writes its values to that folder and a scrape sums them all.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from gateway.observability.record import RequestRecord

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5)
MODEL_LABELS = ["model", "adapter", "tenant"]
GAP_BATCH = 32
"""Token gaps a request counts before adding them to the histogram (and at its end)."""


class _ProcessId:
    """This process's id, read from the kernel once, and again in a forked child."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        os.register_at_fork(after_in_child=self._read)

    def _read(self) -> None:
        self._pid = os.getpid()

    def __call__(self) -> int:
        return self._pid


if values.ValueClass is not values.MutexValue:
    # Several workers: prometheus_client's multiprocess values ask the kernel for the process id
    # at every change, to notice a fork: some fifteen system calls a request, dearer where a
    # sandbox serves them (gVisor). The id read once per process, and again in a forked child,
    # tells a fork as well.
    values.ValueClass = values.MultiProcessValue(  # type: ignore[no-untyped-call]
        process_identifier=_ProcessId()
    )


class SidecarState(Protocol):
    """What the metrics read from a supervised tritonserver."""

    @property
    def name(self) -> str: ...

    @property
    def restarts(self) -> int: ...

    @property
    def pid(self) -> int | None: ...


class _Sidecars(Collector):
    """``gateway_sidecar_up`` and ``gateway_sidecar_restarts_total``, read at scrape time."""

    def __init__(self, sidecars: Callable[[], Iterable[SidecarState]]) -> None:
        self._sidecars = sidecars

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "gateway_sidecar_up",
            "Whether a supervised tritonserver is running.",
            labels=["sidecar"],
        )
        restarts = CounterMetricFamily(
            "gateway_sidecar_restarts",
            "Restarts of a supervised tritonserver after it exited.",
            labels=["sidecar"],
        )
        for sidecar in self._sidecars():
            up.add_metric([sidecar.name], 1.0 if sidecar.pid is not None else 0.0)
            restarts.add_metric([sidecar.name], float(sidecar.restarts))
        yield up
        yield restarts


class _Children:
    """A labelled metric's children, each looked up in prometheus_client once per label set.

    Label values are bounded (see above), and so is this cache.
    """

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class TokenGaps:
    """One request's token gaps, counted here and added to its
    ``gateway_inter_token_latency_seconds`` series ``GAP_BATCH`` at a time and at ``flush``.

    With several workers every observation of a histogram takes a lock, reads the process id and
    writes a shared file for its sum and for its bucket: per token, a fourteenth of a worker's
    time at 320 streams (GPU host profile). Batched, a bucket is written once per batch with
    its count; a scrape sees a stream's gaps up to ``GAP_BATCH - 1`` late, and a worker killed
    outright loses those of its open streams. The writing reaches into prometheus_client's
    histogram child (``_sum``, ``_buckets``, ``_upper_bounds``: what its own ``observe`` does,
    summed), which ``tests/unit/gateway/observability/test_metrics_batching.py`` holds against
    ``observe``; a child without them (another prometheus_client) is given one ``observe`` per
    gap instead.
    """

    __slots__ = ("_bounds", "_child", "_counts", "_pending", "_total")

    def __init__(self, child: Any) -> None:
        self._child = child
        bulk = all(hasattr(child, name) for name in ("_upper_bounds", "_sum", "_buckets"))
        self._bounds: list[float] | None = list(child._upper_bounds) if bulk else None
        self._counts = [0] * len(self._bounds or ())
        self._total = 0.0
        self._pending = 0

    def add(self, seconds: float) -> None:
        """One gap (a finite number of seconds); the batch is written once it is full."""
        if self._bounds is None:
            self._child.observe(seconds)
            return
        # The first bucket whose bound is at least the gap, as ``observe`` picks it.
        self._counts[bisect_left(self._bounds, seconds)] += 1
        self._total += seconds
        self._pending += 1
        if self._pending >= GAP_BATCH:
            self.flush()

    def flush(self) -> None:
        """Write the gaps counted so far."""
        if not self._pending:
            return
        child = self._child
        child._sum.inc(self._total)
        for index, count in enumerate(self._counts):
            if count:
                child._buckets[index].inc(count)
                self._counts[index] = 0
        self._total = 0.0
        self._pending = 0


class GatewayMetrics:
    """Request, latency, token, tenancy and sidecar metrics of one app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.requests = Counter(
            "gateway_requests",
            "HTTP requests answered, by route, method and status.",
            ["route", "method", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "Time from request to the last byte of the answer.",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "gateway_requests_in_flight",
            "Requests being answered.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.generation_requests = Counter(
            "gateway_generation_requests",
            "Completion requests that reached a model, by model, adapter, tenant and status.",
            [*MODEL_LABELS, "status"],
            registry=registry,
        )
        self.time_to_first_token = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from the request's arrival to its first generated text.",
            MODEL_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.inter_token_latency = Histogram(
            "gateway_inter_token_latency_seconds",
            "Time between consecutive pieces of streamed text of one choice (a stream's gaps are "
            f"written {GAP_BATCH} at a time and when it ends).",
            MODEL_LABELS,
            buckets=TOKEN_GAP_BUCKETS,
            registry=registry,
        )
        self.end_to_end = Histogram(
            "gateway_e2e_request_latency_seconds",
            "Time from a completion request's arrival to the end of its answer.",
            MODEL_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_time = Histogram(
            "gateway_request_queue_seconds",
            "Time from a completion request's arrival to its call to Triton (templating, "
            "authentication and admission).",
            MODEL_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "gateway_prompt_tokens", "Prompt tokens processed.", MODEL_LABELS, registry=registry
        )
        self.completion_tokens = Counter(
            "gateway_completion_tokens",
            "Completion tokens generated.",
            MODEL_LABELS,
            registry=registry,
        )
        self.cached_prompt_tokens = Counter(
            "gateway_cached_prompt_tokens",
            "Prompt tokens the engine found in its KV cache (prefix reuse); also counted, and "
            "billed, as prompt tokens.",
            MODEL_LABELS,
            registry=registry,
        )
        self.rate_limited = Counter(
            "gateway_rate_limited",
            "Requests refused by a tenant limit, by tenant and limit.",
            ["tenant", "limit"],
            registry=registry,
        )
        self.limiter_unavailable = Counter(
            "gateway_limiter_unavailable",
            "Admissions while the rate-limit store was unreachable, by the policy applied.",
            ["policy"],
            registry=registry,
        )
        self.tenant_requests_in_flight = Gauge(
            "gateway_tenant_requests_in_flight",
            "Admitted requests of each tenant not yet settled, in this gateway.",
            ["tenant"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.tenant_tokens = Counter(
            "gateway_tenant_tokens",
            "Prompt plus completion tokens charged to each tenant.",
            ["tenant"],
            registry=registry,
        )

        self._sidecars: _Sidecars | None = None
        self._requests = _Children(self.requests)
        self._duration = _Children(self.duration)
        self._generation_requests = _Children(self.generation_requests)
        self._time_to_first_token = _Children(self.time_to_first_token)
        self._inter_token_latency = _Children(self.inter_token_latency)
        self._end_to_end = _Children(self.end_to_end)
        self.transport_info = Gauge(
            "gateway_triton_transport_info",
            "1 for each Triton address of each served model, by the transport decided at start "
            "(grpc or http) and why (settings, keeper, keeper_off, keeper_unbuilt, "
            "not_supervised).",
            ["model", "endpoint", "transport", "reason"],
            registry=registry,
            multiprocess_mode="max",
        )
        self._queue_time = _Children(self.queue_time)
        self._prompt_tokens = _Children(self.prompt_tokens)
        self._completion_tokens = _Children(self.completion_tokens)
        self._cached_prompt_tokens = _Children(self.cached_prompt_tokens)
        self._tenant_requests_in_flight = _Children(self.tenant_requests_in_flight)
        self._tenant_tokens = _Children(self.tenant_tokens)

    def watch_sidecars(self, sidecars: Callable[[], Iterable[SidecarState]]) -> None:
        """Report the state of the supervised sidecars ``sidecars()`` returns at each scrape."""
        self._sidecars = _Sidecars(sidecars)
        self.registry.register(self._sidecars)

    def record_transports(self, rows: Iterable[tuple[str, str, str, str]]) -> None:
        """The transports decided at start: (model, endpoint, transport, reason) each."""
        for row in rows:
            self.transport_info.labels(*row).set(1)

    def record_rate_limited(self, tenant: str, limit: str) -> None:
        """A limit refused a request of ``tenant``."""
        self.rate_limited.labels(tenant, limit).inc()

    def record_limiter_unavailable(self, policy: str) -> None:
        """An admission met an unreachable store and applied ``policy``."""
        self.limiter_unavailable.labels(policy).inc()

    def tenant_in_flight(self, tenant: str, change: int) -> None:
        """A request of ``tenant`` was admitted (+1) or settled (-1)."""
        self._tenant_requests_in_flight(tenant).inc(change)

    def record_tenant_tokens(self, tenant: str, tokens: int) -> None:
        """A settled request of ``tenant`` used ``tokens``."""
        self._tenant_tokens(tenant).inc(max(0, tokens))

    def record_queue(self, record: RequestRecord) -> None:
        """The request reached Triton ``record.queue_s`` after it arrived."""
        if record.queue_s is not None:
            self._queue_time(*labels_of(record)).observe(record.queue_s)

    def record_first_token(self, record: RequestRecord) -> None:
        """The request's first text came ``record.first_token_s`` after it arrived."""
        if record.first_token_s is not None:
            self._time_to_first_token(*labels_of(record)).observe(record.first_token_s)

    def token_gaps(self, record: RequestRecord) -> TokenGaps:
        """The counter of the gaps between consecutive pieces of ``record``'s streamed text;
        ``flush`` it when the request ends."""
        return TokenGaps(self._inter_token_latency(*labels_of(record)))

    def record_tokens(self, record: RequestRecord, prompt: int, completion: int) -> None:
        """Token counts of one finished choice."""
        self._prompt_tokens(*labels_of(record)).inc(prompt)
        self._completion_tokens(*labels_of(record)).inc(completion)

    def record_cached_tokens(self, record: RequestRecord, cached: int) -> None:
        """``cached`` tokens of one prompt came from the engine's KV cache."""
        self._cached_prompt_tokens(*labels_of(record)).inc(cached)

    def record_request(self, record: RequestRecord, seconds: float) -> None:
        """One answered HTTP request; completion requests also by model, adapter and tenant."""
        self._requests(record.route, record.method, str(record.status)).inc()
        self._duration(record.route, record.method).observe(seconds)
        if record.generates:
            self._generation_requests(*labels_of(record), str(record.status)).inc()
            if record.status < 400:
                self._end_to_end(*labels_of(record)).observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric, of every worker process."""
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not folder:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=folder)  # type: ignore[no-untyped-call]
        if self._sidecars is not None:
            registry.register(self._sidecars)
        return generate_latest(registry)


def labels_of(record: RequestRecord) -> tuple[str, str, str]:
    """A request's ``model``, ``adapter`` and ``tenant`` label values, all from configuration."""
    return record.model, record.adapter, record.tenant
