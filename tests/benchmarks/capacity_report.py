"""The capacity benchmark's report: its levels as a Markdown table against direct Triton, and a
plot of tokens/s and time to first token (``tests/benchmarks/capacity.py`` measures them)."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.benchmarks.cpu_sets import topology

_ARRIVALS = {
    "staggered": "the streams' first requests spread over one request's length (not measured)",
    "burst": "every stream starting at once and staying in step (all requests arrive together)",
}


def render_markdown(report: dict[str, Any]) -> str:
    """The table of every level: each gateway against direct Triton at the same streams (in the
    same round), a chat against direct Triton given the templated conversation's ids; with
    several rounds, each row's median and range over them."""
    rows = report["rows"]
    direct = {_level(r): r for r in rows if r["target"] == "direct"}
    c = report["conditions"]
    m = report["machine"]
    lines = [
        "# Capacity: streamed tokens through the gateway against direct Triton",
        "",
        f"{report['date']}; {m['cpus']} CPUs ({m['cpu_model']}), Python {m['python']}. Paced "
        f"load-test engine: {c['rate_tokens_per_s_per_stream']:g} tokens/s per stream, "
        f"{c['tokens']} tokens per request, a {c['prompt_tokens']}-token prompt "
        f"({c.get('chat_prompt_tokens', '?')} as a chat), "
        f"{c['engine_instances']} engine instances; {c['seconds_per_level']:g} s per level after "
        f"a warm-up; {c['client_processes']} load-generator processes; "
        f"{_ARRIVALS[c.get('arrivals', 'burst')]}{_think(c)}{_cpus(c)}. "
        "`python -m tests.benchmarks.capacity`.",
        "",
        "| target | endpoint | streams | tokens/s | of direct | TTFT p50 / p99 ms | added TTFT "
        "p50 ms | ITL p50 / p99 ms | added ITL p50 ms | errors | cores: triton / gateway / "
        "load generator |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    rounds = 1 + max((r.get("round", 0) for r in rows), default=0)
    for row in rows:
        base = _baseline(row, direct)
        share = f"{100 * row['tokens_per_s'] / base['tokens_per_s']:.1f}%" if base else "-"
        added_ttft = f"{row['ttft_p50_ms'] - base['ttft_p50_ms']:+.2f}" if base else "-"
        added_itl = f"{row['itl_p50_ms'] - base['itl_p50_ms']:+.3f}" if base else "-"
        cpu = row["cpu"]
        cores = " / ".join(f"{cpu.get(k, 0):.1f}" for k in ("triton", "gateway", "load generator"))
        target = f"{row['target']} #{row.get('round', 0)}" if rounds > 1 else row["target"]
        lines.append(
            f"| {target} | {row['endpoint']} | {row['streams']} | "
            f"{row['tokens_per_s']:,.0f} | {share} | {row['ttft_p50_ms']:.1f} / "
            f"{row['ttft_p99_ms']:.1f} | {added_ttft} | {row['itl_p50_ms']:.2f} / "
            f"{row['itl_p99_ms']:.2f} | {added_itl} | {row['errors']} | {cores} |"
        )
    if rounds > 1:
        lines += ["", *_over_rounds(rows, direct, rounds)]
    return "\n".join(lines) + "\n"


def _level(row: dict[str, Any]) -> tuple[int, int, str]:
    return row.get("round", 0), row["streams"], row["endpoint"]


def _baseline(row: dict[str, Any], direct: dict[tuple[int, int, str], Any]) -> Any:
    """Direct Triton at the row's level in the row's round; none for direct's own rows, nor
    where that direct level failed."""
    base = direct.get(_level(row))
    if row["target"] == "direct" or not base or not base["tokens_per_s"] or base["errors"]:
        return None
    return base


def _over_rounds(
    rows: list[dict[str, Any]], direct: dict[tuple[int, int, str], Any], rounds: int
) -> list[str]:
    """Each target's share of direct's tokens/s and added latencies at each level: the median
    of its rounds and their range."""
    lines = [
        f"Over the {rounds} rounds (each against direct Triton in its own round): median "
        "[lowest, highest].",
        "",
        "| target | endpoint | streams | rounds | of direct | added TTFT p50 ms | "
        "added ITL p50 ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, str, int], list[tuple[float, float, float]]] = {}
    for row in rows:
        base = _baseline(row, direct)
        if base is not None:
            groups.setdefault((row["target"], row["endpoint"], row["streams"]), []).append(
                (
                    100 * row["tokens_per_s"] / base["tokens_per_s"],
                    row["ttft_p50_ms"] - base["ttft_p50_ms"],
                    row["itl_p50_ms"] - base["itl_p50_ms"],
                )
            )
    for (target, endpoint, streams), found in groups.items():
        share, ttft, itl = zip(*found, strict=True)
        lines.append(
            f"| {target} | {endpoint} | {streams} | {len(found)} | "
            f"{median_range(share, '.1f', '%')} | {median_range(ttft, '+.2f')} | "
            f"{median_range(itl, '+.3f')} |"
        )
    return lines


def median_range(values: Iterable[float], form: str, unit: str = "") -> str:
    """``median [lowest, highest]`` of ``values``, each as ``form``, the median with ``unit``."""
    ordered = sorted(values)
    return f"{statistics.median(ordered):{form}}{unit} [{ordered[0]:{form}}, {ordered[-1]:{form}}]"


def render_plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r["endpoint"] == "text"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for target in dict.fromkeys(r["target"] for r in rows):
        # Each level once: the median of its rounds.
        levels: dict[int, list[dict[str, Any]]] = {}
        for row in rows:
            if row["target"] == target:
                levels.setdefault(row["streams"], []).append(row)
        streams = sorted(levels)
        for axis, key in ((left, "tokens_per_s"), (right, "ttft_p50_ms")):
            values = [statistics.median(r[key] for r in levels[s]) for s in streams]
            axis.plot(streams, values, marker="o", label=target)
    for axis, label in ((left, "streamed tokens/s"), (right, "time to first token p50 (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent streams")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle("Gateway against direct Triton, paced load-test engine")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def report_of(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    prompt: int,
    chat_prompt: int,
    rounds: int,
) -> dict[str, Any]:
    """A run's report: the machine, the conditions and every row measured in ``rounds``."""
    return {
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "python": platform.python_version(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "conditions": {
            "rate_tokens_per_s_per_stream": args.rate,
            "tokens": args.tokens,
            "prompt_tokens": prompt,
            "chat_prompt_tokens": chat_prompt,
            "engine_instances": args.instances,
            "seconds_per_level": args.seconds,
            "client_processes": args.clients,
            "rounds": rounds,
            "arrivals": args.arrivals,
            "think_ms": args.think_ms,
            "cpus": list(getattr(args, "cpus", None) or []),
            "cpu_siblings": topology(),
        },
        "rows": rows,
    }


def _think(conditions: dict[str, Any]) -> str:
    think = conditions.get("think_ms") or 0
    if not think:
        return ""
    return f"; each stream pauses {think:g} ms between an answer's end and its next request"


def _cpus(conditions: dict[str, Any]) -> str:
    sets = conditions.get("cpus")
    if not sets:
        return ""
    siblings = conditions.get("cpu_siblings")
    return f"; CPU sets {' '.join(sets)}" + (f" (core siblings: {siblings})" if siblings else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
