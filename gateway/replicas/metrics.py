"""Per-replica Prometheus metrics, read from the pools when scraped.

Labels are the model (from configuration) and the replica's name (configured, a sidecar's, or
an address its DNS name resolved to); a replica that leaves its pool leaves the metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol, runtime_checkable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.replicas.pool import Replica, ReplicaPool

LABELS = ["model", "replica"]


@runtime_checkable
class CountsAdapterLoads(Protocol):
    """A backend that counts the requests that carried LoRA weights to an engine."""

    adapter_loads: Mapping[tuple[str, str, str], int]
    """By (replica address, Triton model, ``first`` or ``evicted``)."""


def _gauges() -> dict[str, GaugeMetricFamily]:
    described = {
        "in_flight": "Requests this gateway has on the replica now.",
        "up": "Whether the replica takes requests (1) or is pending or ejected (0).",
        "waiting_requests": "Waiting requests its engine reported (a score input).",
        "scheduled_requests": "Scheduled requests its engine reported (a score input).",
        "kv_cache_utilization": "Share of its engine's KV-cache blocks in use (a score input).",
        "kv_handoffs": "KV-cache handoffs its engine sent or received since it started "
        "(disaggregated serving: nv_trt_llm_disaggregated_serving_metrics request_count).",
        "kv_transfer_milliseconds": "Time its engine spent on those handoffs in all "
        "(nv_trt_llm_disaggregated_serving_metrics kv_cache_transfer_ms).",
    }
    return {
        key: GaugeMetricFamily(f"gateway_replica_{key}", text, labels=LABELS)
        for key, text in described.items()
    }


def _counters() -> dict[str, CounterMetricFamily]:
    described = {
        "requests": "Requests routed to the replica (each attempt of a retried one counts).",
        "retries": "Requests that failed on the replica before their first token and were "
        "sent to another.",
        "prefix_hits": "Requests routed to the replica that owns the prompt's leading blocks.",
        "adapter_hits": "LoRA requests routed to the replica that holds the adapter.",
    }
    return {
        key: CounterMetricFamily(f"gateway_replica_{key}", text, labels=LABELS)
        for key, text in described.items()
    }


class ReplicaMetrics(Collector):
    """``gateway_replica_*`` and ``gateway_model_overloaded_total``."""

    def __init__(self, pools: Callable[[], Iterable[ReplicaPool]], backend: Callable[[], object]):
        self._pools = pools
        self._backend = backend

    def collect(self) -> Iterator[Metric]:
        gauges, counters = _gauges(), _counters()
        ejections = CounterMetricFamily(
            "gateway_replica_ejections",
            "Times the replica was taken out of routing, by reason (unavailable, probe, stalled).",
            labels=[*LABELS, "reason"],
        )
        loads = CounterMetricFamily(
            "gateway_replica_adapter_loads",
            "Requests that carried LoRA weights to the replica's engine: its first request "
            "for the adapter (first) or a resend after the engine evicted it (evicted).",
            labels=[*LABELS, "reason"],
        )
        overloaded = CounterMetricFamily(
            "gateway_model_overloaded",
            "Requests answered 503 because every replica was at its queue depth.",
            labels=["model"],
        )
        backend = self._backend()
        adapter_loads = backend.adapter_loads if isinstance(backend, CountsAdapterLoads) else {}
        for pool in self._pools():
            overloaded.add_metric([pool.model], float(pool.overloaded))
            for replica in pool.replicas.values():
                labels = [pool.model, replica.name]
                self._replica(pool, replica, labels, gauges, counters)
                for reason, count in replica.health.ejections.items():
                    ejections.add_metric([*labels, reason], float(count))
                for reason in ("first", "evicted"):
                    key = (replica.endpoint.url, pool.target.triton_model, reason)
                    loads.add_metric([*labels, reason], float(adapter_loads.get(key, 0)))
        yield from gauges.values()
        yield from counters.values()
        yield ejections
        yield loads
        yield overloaded

    @staticmethod
    def _replica(
        pool: ReplicaPool,
        replica: Replica,
        labels: list[str],
        gauges: dict[str, GaugeMetricFamily],
        counters: dict[str, CounterMetricFamily],
    ) -> None:
        signals = replica.fresh_signals(pool.clock(), pool.settings.scrape_interval_s)
        gauges["in_flight"].add_metric(labels, float(replica.in_flight))
        gauges["up"].add_metric(labels, 1.0 if replica.health.routable else 0.0)
        if signals is not None:
            gauges["waiting_requests"].add_metric(labels, signals.waiting)
            gauges["scheduled_requests"].add_metric(labels, signals.scheduled)
            gauges["kv_cache_utilization"].add_metric(labels, signals.kv_fraction)
            if signals.handoffs is not None:
                gauges["kv_handoffs"].add_metric(labels, signals.handoffs)
            if signals.transfer_ms is not None:
                gauges["kv_transfer_milliseconds"].add_metric(labels, signals.transfer_ms)
        counters["requests"].add_metric(labels, float(replica.routed))
        counters["retries"].add_metric(labels, float(replica.retries))
        counters["prefix_hits"].add_metric(labels, float(replica.prefix_hits))
        counters["adapter_hits"].add_metric(labels, float(replica.adapter_hits))
