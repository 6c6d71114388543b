"""Token gaps counted in batches expose the same histogram as one ``observe`` per gap."""

from __future__ import annotations

import random

import pytest
from prometheus_client import generate_latest

from gateway.observability.metrics import GAP_BATCH, TOKEN_GAP_BUCKETS, GatewayMetrics, TokenGaps
from gateway.observability.record import RequestRecord

FAMILY = "gateway_inter_token_latency_seconds"


def _record() -> RequestRecord:
    return RequestRecord("id", "POST", "/v1/completions", model="m", tenant="t")


def _series(metrics: GatewayMetrics) -> list[str]:
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if line.startswith(FAMILY)]


def _values(metrics: GatewayMetrics) -> dict[str, float]:
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in _series(metrics))
        if not name.startswith(f"{FAMILY}_created")
    }


def _gaps() -> list[float]:
    rng = random.Random(7)
    # Every bound exactly (an observation equal to a bound falls in that bucket), values
    # between them, and values past the last bound (the +Inf bucket).
    gaps = [*TOKEN_GAP_BUCKETS, 0.0, 5.0, 30.0]
    gaps += [rng.uniform(0, 3) for _ in range(3 * GAP_BATCH)]
    return gaps


def test_batched_gaps_expose_what_one_observe_per_gap_does() -> None:
    batched, observed = GatewayMetrics(), GatewayMetrics()
    gaps = batched.token_gaps(_record())
    child = observed.inter_token_latency.labels("m", "", "t")
    for gap in _gaps():
        gaps.add(gap)
        child.observe(gap)
    gaps.flush()
    expected = _values(observed)
    # The sum is added in another order: equal up to rounding; every bucket and the count exact.
    assert _values(batched) == {
        name: pytest.approx(value) if "_sum" in name else value for name, value in expected.items()
    }
    assert f'{FAMILY}_count{{adapter="",model="m",tenant="t"}} {float(len(_gaps()))}' in (
        _series(batched)
    )


def test_gaps_are_written_once_a_batch_is_full_and_at_flush() -> None:
    metrics = GatewayMetrics()
    gaps = metrics.token_gaps(_record())
    count = f'{FAMILY}_count{{adapter="",model="m",tenant="t"}}'
    for _ in range(GAP_BATCH - 1):
        gaps.add(0.01)
    assert f"{count} 0.0" in _series(metrics)
    gaps.add(0.01)
    assert f"{count} {float(GAP_BATCH)}" in _series(metrics)
    gaps.add(0.02)
    gaps.flush()
    gaps.flush()
    assert f"{count} {float(GAP_BATCH + 1)}" in _series(metrics)


class _PlainChild:
    """A histogram child with only the public ``observe``."""

    def __init__(self) -> None:
        self.observed: list[float] = []

    def observe(self, amount: float) -> None:
        self.observed.append(amount)


def test_a_child_without_the_private_fields_gets_one_observe_per_gap() -> None:
    child = _PlainChild()
    gaps = TokenGaps(child)
    for gap in (0.01, 0.02, 0.5):
        gaps.add(gap)
    gaps.flush()
    assert child.observed == [0.01, 0.02, 0.5]
