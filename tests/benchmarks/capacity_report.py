"""The capacity benchmark's report: its levels as a Markdown table against direct Triton, and a
plot of tokens/s and time to first token (``tests/benchmarks/capacity.py`` measures them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_ARRIVALS = {
    "staggered": "the streams' first requests spread over one request's length (not measured)",
    "burst": "every stream starting at once and staying in step (all requests arrive together)",
}


def render_markdown(report: dict[str, Any]) -> str:
    """The table of every level: each gateway against direct Triton at the same streams, a chat
    against direct Triton given the templated conversation's ids."""
    rows = report["rows"]
    direct = {(r["streams"], r["endpoint"]): r for r in rows if r["target"] == "direct"}
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
        f"{_ARRIVALS[c.get('arrivals', 'burst')]}. `python -m tests.benchmarks.capacity`.",
        "",
        "| target | endpoint | streams | tokens/s | of direct | TTFT p50 / p99 ms | added TTFT "
        "p50 ms | ITL p50 / p99 ms | added ITL p50 ms | errors | cores: triton / gateway / "
        "load generator |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        base = direct.get((row["streams"], row["endpoint"]))
        if base and (not base["tokens_per_s"] or base["errors"]):
            base = None  # a direct level that failed is no baseline
        share = f"{100 * row['tokens_per_s'] / base['tokens_per_s']:.1f}%" if base else "-"
        added_ttft = f"{row['ttft_p50_ms'] - base['ttft_p50_ms']:+.2f}" if base else "-"
        added_itl = f"{row['itl_p50_ms'] - base['itl_p50_ms']:+.3f}" if base else "-"
        if row["target"] == "direct":
            share, added_ttft, added_itl = "-", "-", "-"
        cpu = row["cpu"]
        cores = " / ".join(f"{cpu.get(k, 0):.1f}" for k in ("triton", "gateway", "load generator"))
        lines.append(
            f"| {row['target']} | {row['endpoint']} | {row['streams']} | "
            f"{row['tokens_per_s']:,.0f} | {share} | {row['ttft_p50_ms']:.1f} / "
            f"{row['ttft_p99_ms']:.1f} | {added_ttft} | {row['itl_p50_ms']:.2f} / "
            f"{row['itl_p99_ms']:.2f} | {added_itl} | {row['errors']} | {cores} |"
        )
    return "\n".join(lines) + "\n"


def render_plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r["endpoint"] == "text"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for target in dict.fromkeys(r["target"] for r in rows):
        mine = [r for r in rows if r["target"] == target]
        streams = [r["streams"] for r in mine]
        left.plot(streams, [r["tokens_per_s"] for r in mine], marker="o", label=target)
        right.plot(streams, [r["ttft_p50_ms"] for r in mine], marker="o", label=target)
    for axis, label in ((left, "streamed tokens/s"), (right, "time to first token p50 (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent streams")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle("Gateway against direct Triton, paced load-test engine")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
