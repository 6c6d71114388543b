"""The GPU benchmark's runs compared: medians by level, and each target against another run by
run (the repeats of a level pair up, one after another or side by side)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from tests.benchmarks.capacity_report import median_range


def as_dict(level: Any) -> dict[str, Any]:
    return level if isinstance(level, dict) else dict(level.__dict__)


def runs_of(levels: list[Any], target: str) -> dict[int, list[dict[str, Any]]]:
    """Every repeat of one target, by concurrency."""
    runs: dict[int, list[dict[str, Any]]] = {}
    for level in map(as_dict, levels):
        if level["target"] == target:
            runs.setdefault(level["concurrency"], []).append(level)
    return runs


def medians(levels: list[Any], target: str) -> dict[int, dict[str, float]]:
    """The median of every figure over the repeats, by concurrency."""
    return {concurrency: figures(runs) for concurrency, runs in runs_of(levels, target).items()}


def figures(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The median of every figure over ``runs``."""
    return {key: median_known([run.get(key, math.nan) for run in runs]) for key in FIGURES}


def median_known(values: list[float]) -> float:
    """Over the runs that have the figure (a run whose tokens all came in one chunk has no ITL)."""
    known = [value for value in values if not math.isnan(value)]
    return statistics.median(known) if known else math.nan


FIGURES = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms",
            "e2e_p50_ms", "client_cores", "tokens_per_step")  # fmt: skip


def beside(direct: list[dict[str, Any]], mine: list[dict[str, Any]]) -> dict[str, float]:
    """The medians of the runs of ``direct`` that ran beside ``mine`` (side by side, each pair is
    a repeat of its own): the direct runs beside another target shared other engine steps."""
    repeats = {run.get("repeat", 0) for run in mine}
    return figures([run for run in direct if run.get("repeat", 0) in repeats])


def pairs(levels: list[Any], target: str, base: str) -> dict[int, list[tuple[float, ...]]]:
    """``target`` against ``base`` run by run, by concurrency: the share of base's tokens/s and
    the added TTFT and ITL p50 of every repeat both ran. The interleaved runs pair up, so a drift
    of the host between runs falls on both sides of a pair."""
    found: dict[int, list[tuple[float, ...]]] = {}
    mine = {
        (concurrency, run.get("repeat", 0)): run
        for concurrency, runs in runs_of(levels, target).items()
        for run in runs
    }
    for concurrency, runs in runs_of(levels, base).items():
        for other in runs:
            run = mine.get((concurrency, other.get("repeat", 0)))
            if run is None or not other["tokens_per_s"]:
                continue
            pair = (
                100 * run["tokens_per_s"] / other["tokens_per_s"],
                run["ttft_p50_ms"] - other["ttft_p50_ms"],
                run["itl_p50_ms"] - other["itl_p50_ms"],
            )
            if not any(math.isnan(value) for value in pair):
                found.setdefault(concurrency, []).append(pair)
    return found


def paired_table(levels: list[Any], targets: list[str]) -> list[str]:
    """Every target against direct run by run, and each gateway against every direct client
    that asks the engine for more than the text (``direct-counts``, or all the gateway asks:
    ``direct-greedy-counts-perf``): median [lowest, highest] of the pairs. Nothing for a run of
    one repeat."""
    comparisons = [(name, "direct") for name in targets if name != "direct"]
    comparisons += [
        (name, base)
        for name in targets
        if name.startswith("gateway")
        for base in targets
        if base.startswith("direct-") and "counts" in base.split("-")
    ]
    rows = []
    for target, base in comparisons:
        for concurrency, found in sorted(pairs(levels, target, base).items()):
            if len(found) < 2:
                continue
            share, ttft, itl = zip(*found, strict=True)
            rows.append(
                f"| {concurrency} | {target} | {base} | {len(found)} | "
                f"{median_range(share, '.1f', '%')} | {median_range(ttft, '+.1f')} | "
                f"{median_range(itl, '+.2f')} |"
            )
    if not rows:
        return []
    return [
        "",
        "Run by run (each run against the other target's run of the same repeat): median "
        "[lowest, highest] of the pairs.",
        "",
        "| concurrency | target | against | pairs | share of its tokens/s | added TTFT p50 ms "
        "| added ITL p50 ms |",
        "|---:|---|---|---:|---:|---:|---:|",
        *rows,
    ]
