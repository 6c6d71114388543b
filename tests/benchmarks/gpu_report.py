"""Figures of the GPU benchmark: per-level summaries, the Markdown table and the plot."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.benchmarks.gpu_clients import ENTRY_NAMES
from tests.benchmarks.gpu_pairs import as_dict, beside, medians, paired_table, runs_of


@dataclass(frozen=True)
class Level:
    """One target at one concurrency."""

    target: str
    concurrency: int
    requests: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    e2e_p50_ms: float
    incomplete: int
    repeat: int = 0
    client_cores: float = 0.0
    """CPU the benchmark's own process spent per second of the level: near 1.0, it was the limit."""
    wall_s: float = 0.0
    engine_steps: int = 0
    """Decode steps the engine ran during the level (its ``iteration_counter``); 0 if unknown."""
    tokens_per_step: float = math.nan
    """Tokens streamed per decode step: the engine's mean decode batch over the level."""
    served_ttft_p99_s: float = math.nan
    """The gateway's own time to first token (from its arrival there), p99 as the upper bound
    of its histogram bucket: what the client measured beyond it was spent before the gateway."""

    def with_steps(self, steps: int) -> Level:
        """This level with the engine's decode steps during it."""
        tokens = self.tokens_per_s * self.wall_s
        per_step = tokens / steps if steps > 0 else math.nan
        return dataclasses.replace(self, engine_steps=steps, tokens_per_step=per_step)

    def line(self) -> str:
        return (
            f"{self.target:8s} c={self.concurrency:3d} #{self.repeat} n={self.requests:4d} "
            f"{self.tokens_per_s:9.1f} tok/s  TTFT p50 {self.ttft_p50_ms:7.1f} ms "
            f"p99 {self.ttft_p99_ms:7.1f}  ITL p50 {self.itl_p50_ms:6.2f} ms "
            f"p99 {self.itl_p99_ms:6.2f}  e2e p50 {self.e2e_p50_ms:8.1f} ms  "
            f"client {self.client_cores:.2f} cores  engine steps {self.engine_steps} "
            f"({self.tokens_per_step:.1f} tokens each)"
            + (
                ""
                if math.isnan(self.served_ttft_p99_s)
                else f"  gateway's own TTFT p99 <= {self.served_ttft_p99_s} s"
            )
        )


def bucket_quantile(buckets: dict[float, float], q: float) -> float:
    """The upper bound of the histogram bucket holding quantile ``q``, from cumulative counts by
    upper bound (Prometheus' ``le``); NaN without observations."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return math.nan
    for bound in bounds:
        if buckets[bound] >= q * total:
            return bound
    return bounds[-1]


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarise(
    target: str,
    concurrency: int,
    results: list[dict[str, Any]],
    wall: float,
    expected: int,
    client_cores: float = 0.0,
) -> Level:
    """Aggregate tokens/s over the wall time; latencies over every request and token gap."""
    ttft = [r["arrivals"][0] * 1000 for r in results if r["arrivals"]]
    gaps = [
        (later - earlier) * 1000
        for r in results
        for earlier, later in zip(r["arrivals"], r["arrivals"][1:], strict=False)
    ]
    tokens = sum(r["tokens"] for r in results)
    return Level(
        target=target,
        concurrency=concurrency,
        requests=len(results),
        tokens_per_s=tokens / wall,
        ttft_p50_ms=_quantile(ttft, 0.5),
        ttft_p99_ms=_quantile(ttft, 0.99),
        itl_p50_ms=_quantile(gaps, 0.5),
        itl_p99_ms=_quantile(gaps, 0.99),
        e2e_p50_ms=statistics.median(r["end"] * 1000 for r in results),
        incomplete=sum(1 for r in results if r["tokens"] < expected),
        client_cores=client_cores,
        wall_s=wall,
    )


def _spread(runs: list[dict[str, Any]], key: str, form: str) -> str:
    values = [run[key] for run in runs if not math.isnan(run.get(key, math.nan))]
    if len(values) <= 1:
        return format(values[0] if values else math.nan, form)
    return f"{statistics.median(values):{form}} ({min(values):{form}}–{max(values):{form}})"


_TRANSPORTS = {"http": "HTTP `generate_stream`", "grpc": "gRPC"}
_ENTRIES = {
    "ensemble": "the `ensemble` as the direct client does",
    "tensorrt_llm_bls": "the BLS",
    "tensorrt_llm": "`tensorrt_llm` itself, the gateway tokenizing and detokenizing",
}


def render_markdown(report: dict[str, Any]) -> str:
    """Medians over the interleaved repeats with their range, and the gateway's share."""
    machine = report["machine"]
    targets = report.get("targets", ["direct", "gateway"])
    by = {name: medians(report["levels"], name) for name in targets}
    direct = by["direct"]
    runs = {name: runs_of(report["levels"], name) for name in targets}
    repeats = max((len(r) for r in runs["direct"].values()), default=1)
    transports = report.get("transport", "grpc")
    transports = [transports] if isinstance(transports, str) else transports
    entries = report.get("entry", ["ensemble"])
    lines = [
        f"# GPU run: {machine.get('gpu', 'CPU')}",
        "",
        f"- Machine: {machine.get('nvidia_smi', 'no GPU')}; {machine['cpus']} CPU cores; "
        f"torch {machine['torch']} (CUDA {machine.get('cuda')}).",
        f"- Models (random weights, bfloat16, PyTorch engine on {report['device']}"
        + (
            f" with mixed batching {'on' if report['mixed_batching'] else 'off'}"
            if "mixed_batching" in report
            else ""
        )
        + ", one "
        f"tritonserver, the {report.get('release', 'v0.19')} release's model configs): "
        + ", ".join(
            f"{name} {count / 1e9:.2f}B parameters" for name, count in report["parameters"].items()
        )
        + f"; gateway and sidecar ready in {report['ready_s']:.0f} s; GPU memory in use "
        + ", ".join(
            f"{value} ({when.replace('_', ' ')})"
            for when, value in report["gpu_memory_used"].items()
        )
        + ".",
        f"- Streaming completions of {report['tokens']} tokens each (a {report['prompt_chars']}"
        "-character prompt), greedy; `direct` is gRPC streaming to the sidecar's `ensemble`"
        + (
            "; `direct-greedy` adds temperature 0 and top_k 1, `direct-perf` asks for perf "
            "metrics and the reused KV blocks (the gateway's cached tokens), `direct-counts` "
            "for the output token count (log probs before the `latest` release), "
            "`direct-counts-prompt` for the prompt's count too, as the gateway did before it "
            "counted text prompts itself; `direct-greedy-counts-perf` sends what the gateway "
            "sends"
            if any(t.startswith("direct-") for t in targets)
            else ""
        )
        + "; `gateway` is `/v1/completions` with `stream: true` through `triton-gateway serve` "
        f"({report.get('gateway_workers', 1)} worker processes{_kept(report)}), which reaches "
        "Triton over "
        f"{' or '.join(_TRANSPORTS[t] for t in transports)}"
        + (" (`gateway-http`, `gateway-grpc`)" if len(transports) > 1 else "")
        + ", calling "
        + " or ".join(_ENTRIES[entry] for entry in entries)
        + (
            f" ({', '.join(f'`-{ENTRY_NAMES[entry]}`' for entry in entries)})."
            if len(entries) > 1
            else "."
        ),
        _order(report, repeats) + ": medians, the range in brackets. `client cores` is the CPU the "
        "benchmark's own process spent per second: well under 1, it was not the limit. "
        "`tokens/step` is the tokens streamed per decode step of the engine: its mean decode "
        "batch." + _cpus(report),
        "",
        "| concurrency | target | tokens/s | of direct | TTFT p50 ms | ITL p50 ms | added ITL p50 "
        "| ITL p99 ms | end to end p50 ms | client cores | tokens/step |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for concurrency in sorted(direct):
        for name in targets:
            mine = runs[name].get(concurrency)
            if not mine:
                continue
            share = added = ""
            if name != "direct" and concurrency in by[name]:
                ours = by[name][concurrency]
                base = (
                    beside(runs["direct"][concurrency], mine)
                    if report.get("side_by_side")
                    else direct[concurrency]
                )
                share = f"{100 * ours['tokens_per_s'] / base['tokens_per_s']:.1f}%"
                added = f"{ours['itl_p50_ms'] - base['itl_p50_ms']:+.2f} ms"
            lines.append(
                f"| {concurrency} | {name} | {_spread(mine, 'tokens_per_s', ',.0f')} | {share} | "
                f"{_spread(mine, 'ttft_p50_ms', '.1f')} | {_spread(mine, 'itl_p50_ms', '.2f')} | "
                f"{added} | {_spread(mine, 'itl_p99_ms', '.2f')} | "
                f"{_spread(mine, 'e2e_p50_ms', '.0f')} | {_spread(mine, 'client_cores', '.2f')} | "
                f"{_spread(mine, 'tokens_per_step', '.1f')} |"
            )
    lines.extend(paired_table(report["levels"], targets))
    lines.append("")
    for name, levels in by.items():
        if 1 in levels and 32 in levels:
            gain = levels[32]["tokens_per_s"] / levels[1]["tokens_per_s"]
            lines.append(f"- In-flight batching gain, 32 streams vs 1 ({name}): {gain:.1f}x.")
    incomplete = sum(level["incomplete"] for level in map(as_dict, report["levels"]))
    lines.append(f"- Requests that ended short of their tokens: {incomplete}.")
    multi = report["multi_model"]
    counts = ", ".join(f"{m} {n} tokens" for m, n in multi["tokens"].items())
    lines.append(
        f"- Two models in one tritonserver, {multi['streams_per_model']} chat streams each at "
        f"once through the gateway: {counts} in {multi['wall_s']:.1f} s; every stream "
        f"complete: {multi['all_complete']}."
    )
    lines.extend(_profile_table(report.get("engine_profiles") or {}))
    return "\n".join(lines) + "\n"


def _order(report: dict[str, Any], repeats: int) -> str:
    """How the runs of a level were laid out."""
    if report.get("side_by_side"):
        return (
            f"- Side by side: every other target ran at the same time as a run of direct, each "
            f"with half of the level's streams (`concurrency` is the engine's streams), "
            f"{repeats} runs of direct per level, after a warm-up. Both take their tokens from "
            "the same engine steps, so what the gateway's requests cost a step falls on both; "
            "`tokens/step` is each target's own share of a step; `of direct` and `added ITL` "
            "compare with the direct runs beside the target's"
        )
    return (
        f"- {repeats} runs per level, the targets interleaved (their order reversed every run"
        + (
            " and rotated every two, so that each takes every place in a run as often"
            if report.get("order") == "turned"
            else ""
        )
        + ") after a warm-up"
    )


_ROLES = {
    "triton": "tritonserver and its stubs",
    "gateway": "the gateway's other processes",
    "load": "this benchmark's clients",
}


def _cpus(report: dict[str, Any]) -> str:
    """The CPU sets each role ran on, where the run had them."""
    sets = report.get("cpus")
    if not sets:
        return ""
    listed = "; ".join(f"{item} ({_ROLES[item.partition('=')[0]]})" for item in sets)
    return f" CPU sets: {listed}; core siblings {report.get('cpu_siblings')}."


def _kept(report: dict[str, Any]) -> str:
    """How long the gateway kept its HTTP connections to Triton, where the report says."""
    seconds = report.get("triton_keep_alive_s")
    if seconds is None:
        return ""
    if not seconds:
        return ", a connection to Triton per request"
    return f", connections to Triton kept alive {seconds:g} s"


def _profile_table(profiles: dict[str, dict[str, float]]) -> list[str]:
    """The engine thread's time by phase, per target and level (py-spy samples)."""
    if not profiles:
        return []
    phases = [name for name in next(iter(profiles.values())) if name != "samples"]
    lines = [
        "",
        "The engine thread's time by phase (py-spy, 200 Hz, during the first run of each target):",
        "",
        "| target | " + " | ".join(phases) + " | samples |",
        "|---|" + "---:|" * (len(phases) + 1),
    ]
    for target, shares in profiles.items():
        cells = " | ".join(f"{shares[name]:.1%}" for name in phases)
        lines.append(f"| {target} | {cells} | {shares['samples']:.0f} |")
    return lines


def render_plot(report: dict[str, Any], path: Path) -> None:
    """Tokens/s and time to first token against concurrency, gateway and direct."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rate, ttft) = plt.subplots(1, 2, figsize=(10, 4))
    styles = itertools.cycle(("s-", "^-", "v-"))
    for target in report.get("targets", ["direct", "gateway"]):
        style = "o--" if target == "direct" else next(styles)
        levels = medians(report["levels"], target)
        xs = sorted(levels)
        rate.plot(xs, [levels[x]["tokens_per_s"] for x in xs], style, label=target)
        ttft.plot(xs, [levels[x]["ttft_p50_ms"] for x in xs], style, label=target)
    for axis, label in ((rate, "tokens/s (all streams)"), (ttft, "time to first token p50 (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent streams")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
        axis.legend()
    figure.suptitle(
        f"{report['machine'].get('gpu', 'CPU')}: engine in tritonserver, gateway in front"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
