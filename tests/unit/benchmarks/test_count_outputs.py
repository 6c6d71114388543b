"""The count outputs benchmark's figures: the rounds' pairs and the CPU a response."""

from __future__ import annotations

import pytest

from tests.benchmarks.count_outputs import Level, summary


def test_the_share_is_the_median_of_the_rounds_pairs_and_the_cpu_the_median_of_rounds() -> None:
    # A host that slows down round after round; the counts cost 10% in every round but one.
    without = [Level(10_000, 50, 30), Level(8_000, 52, 31), Level(5_000, 60, 40)]
    with_counts = [Level(9_000, 56, 33), Level(7_200, 58, 35), Level(5_000, 70, 41)]
    found = summary(without, with_counts)
    assert found["share_pct"] == pytest.approx(90.0)
    assert (found["stub_us"], found["stub_counts_us"]) == (52.0, 58.0)
    assert (found["server_us"], found["server_counts_us"]) == (31.0, 35.0)


def test_rounds_without_a_pair_are_refused() -> None:
    with pytest.raises(ValueError):
        summary([Level(1.0, 1.0, 1.0)] * 2, [Level(1.0, 1.0, 1.0)])
