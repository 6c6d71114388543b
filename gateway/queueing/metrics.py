"""Prometheus metrics of the fair queues, read from every model's slots when scraped.

``gateway_model_saturation`` is the one to scale on (KEDA's Prometheus scaler, an HPA on an
external metric): requests in flight and waiting over the model's slots, 1 when full with
nobody waiting; above 1, requests wait.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from gateway.queueing.gate import ModelSlots


class QueueMetrics(Collector):
    """``gateway_queue_*`` by model and tenant, ``gateway_model_{slots,saturation}`` by model."""

    def __init__(self, slots: Callable[[], Iterable[ModelSlots]]) -> None:
        self._slots = slots

    def collect(self) -> Iterator[Metric]:
        model, tenant = ["model"], ["model", "tenant"]
        depth = GaugeMetricFamily(
            "gateway_queue_depth", "Requests waiting for a slot of the model.", labels=tenant
        )
        oldest = GaugeMetricFamily(
            "gateway_queue_oldest_wait_seconds",
            "How long the model's longest-waiting request has waited.",
            labels=model,
        )
        wait = SummaryMetricFamily(
            "gateway_queue_wait_seconds",
            "Time requests that waited spent in the queue before their slot.",
            labels=tenant,
        )
        slots_total = GaugeMetricFamily(
            "gateway_model_slots",
            "Requests the model takes at once from this gateway.",
            labels=model,
        )
        in_flight = GaugeMetricFamily(
            "gateway_model_slots_in_flight", "Slots of the model held now.", labels=model
        )
        saturation = GaugeMetricFamily(
            "gateway_model_saturation",
            "Requests in flight and waiting over the model's slots: scale out above 1.",
            labels=model,
        )
        dispatched = CounterMetricFamily(
            "gateway_queue_dispatched", "Requests given a slot of the model.", labels=tenant
        )
        tokens = CounterMetricFamily(
            "gateway_queue_served_tokens",
            "Tokens (prompt and completion) of the tenant's requests on the model: its share.",
            labels=tenant,
        )
        refused = CounterMetricFamily(
            "gateway_queue_refused",
            "Requests refused by the queue's bounds (max_queued, max_queue_wait_s).",
            labels=tenant,
        )
        for slots in self._slots():
            name = slots.model
            depths = slots.queue.depths()
            oldest.add_metric([name], slots.oldest_wait_s())
            slots_total.add_metric([name], float(slots.capacity()))
            in_flight.add_metric([name], float(slots.in_flight))
            saturation.add_metric([name], slots.saturation())
            for who, stats in slots.stats.items():
                labels = [name, who]
                depth.add_metric(labels, float(depths.get(who, 0)))
                wait.add_metric(labels, stats.queued, stats.wait_s)
                dispatched.add_metric(labels, float(stats.dispatched))
                tokens.add_metric(labels, stats.tokens)
                refused.add_metric(labels, float(stats.refused))
        yield from (depth, oldest, wait, slots_total, in_flight, saturation)
        yield from (dispatched, tokens, refused)
