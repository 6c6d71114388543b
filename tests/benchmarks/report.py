"""The serving benchmark's report: a line per measured level, the Markdown tables and the plot."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.benchmarks.loadgen import Stats

DIRECT = "direct Triton"
DIRECT_ENGINE = "direct Triton, engine"
DIRECTS = (DIRECT, DIRECT_ENGINE)
TARGETS = (DIRECT, "gateway", DIRECT_ENGINE, "gateway, engine entry", "LiteLLM")
FLOOR = {"gateway": DIRECT, "LiteLLM": DIRECT, "gateway, engine entry": DIRECT_ENGINE}
"""Each server's floor: direct Triton to the same entry model."""


@dataclass(frozen=True)
class Cell:
    """One measured load level of one target."""

    engine: str
    target: str
    endpoint: str
    stream: bool
    concurrency: int
    stats: Stats
    cpu_s: float
    triton_cpu_s: float

    @property
    def cpu_ms_per_request(self) -> float:
        """Server CPU (its process tree) per completed request."""
        return 1e3 * self.cpu_s / self.stats.requests if self.stats.requests else 0.0


def print_cell(cell: Cell) -> None:
    """One line as each level finishes."""
    s = cell.stats
    mode = "stream" if cell.stream else "whole"
    error = f"  first error: {s.first_error}" if s.first_error else ""
    print(
        f"{cell.engine:8} {cell.target:22} {cell.endpoint:11} {mode:6} c={cell.concurrency:<3} "
        f"{s.rps:7.1f} req/s  ttft p50 {s.ttft_ms[0]:7.2f} ms  e2e p50 {s.e2e_ms[0]:7.2f} ms  "
        f"cpu {cell.cpu_ms_per_request:6.2f} ms/req  errors {s.errors}{error}",
        flush=True,
    )


def _find(cells: Iterable[Cell], **where: Any) -> Cell | None:
    for cell in cells:
        if all(getattr(cell, key) == value for key, value in where.items()):
            return cell
    return None


def _fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}{unit}"


def headline(meta: dict[str, Any], cells: Sequence[Cell]) -> list[str]:  # noqa: C901
    """The figures of the targets side by side (load-test engine, completions)."""

    def pick(target: str, stream: bool, level: int) -> Cell | None:
        endpoint = "completions"
        return _find(
            cells, engine="loadtest", target=target, endpoint=endpoint, stream=stream,
            concurrency=level,
        )  # fmt: skip

    targets = [t for t in TARGETS if any(c.target == t for c in cells)]
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, value: Any) -> None:
        rows.append((label, [value(target) for target in targets]))

    def e2e(target: str) -> str:
        cell = pick(target, False, 1)
        return _fmt(cell and cell.stats.e2e_ms[0], " ms")

    def ttft(target: str) -> str:
        cell = pick(target, True, 1)
        return _fmt(cell and cell.stats.ttft_ms[0], " ms")

    def added_ttft(target: str) -> str:
        cell, floor = pick(target, True, 1), pick(FLOOR.get(target, ""), True, 1)
        if cell is None or floor is None:
            return "-"
        return _fmt(cell.stats.ttft_ms[0] - floor.stats.ttft_ms[0], " ms")

    def cpu(stream: bool) -> Any:
        def value(target: str) -> str:
            cell = pick(target, stream, 1)
            if cell is None:
                return "-"
            client = " (gRPC client)" if target in DIRECTS else ""
            return _fmt(cell.cpu_ms_per_request, " ms") + client

        return value

    def per_token(target: str) -> str:
        whole, streamed = pick(target, False, 1), pick(target, True, 1)
        if whole is None or streamed is None:
            return "-"
        extra = streamed.cpu_ms_per_request - whole.cpu_ms_per_request
        client = " (gRPC client)" if target in DIRECTS else ""
        return _fmt(1e3 * extra / meta["tokens"], " µs", 0) + client

    def rps(target: str) -> str:
        cell, floor = pick(target, True, 32), pick(FLOOR.get(target, ""), True, 32)
        if cell is None:
            return "-"
        ratio = f" ({100 * cell.stats.rps / floor.stats.rps:.0f}%)" if floor else ""
        return f"{cell.stats.rps:,.0f}{ratio}"

    def errors(target: str) -> str:
        return str(sum(c.stats.errors for c in cells if c.target == target))

    row("completion, non-streaming, p50 (c=1)", e2e)
    row("server CPU per non-streaming request (c=1)", cpu(False))
    row("streaming time to first token, p50 (c=1)", ttft)
    row("added time to first token over direct Triton to the same entry (c=1)", added_ttft)
    row(f"server CPU per streamed request, {meta['tokens']} tokens (c=1)", cpu(True))
    row("server CPU per streamed token (streamed minus whole, c=1)", per_token)
    row("streaming requests/s at concurrency 32", rps)
    rss = {"gateway": meta["gateway_rss_mib"], "LiteLLM": meta["litellm_rss_mib"]}
    rss["gateway, engine entry"] = meta["gateway_rss_mib"]
    row("server RSS after the run", lambda t: _fmt(rss.get(t), " MiB", 0))
    row("errors, every level", errors)
    lines = ["| | " + " | ".join(targets) + " |", "|---" * (len(targets) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(values) + " |" for label, values in rows]
    return lines


def detail(cells: Sequence[Cell], tokens: int) -> list[str]:
    """Every measured level."""
    lines = [
        "| engine | endpoint | mode | target | c | req/s | TTFT p50/p99 ms | ITL p50/p99 ms "
        "| e2e p50/p99 ms | CPU ms/req | CPU µs/token | Triton CPU ms/req | errors |",
        "|---" * 13 + "|",
    ]
    for cell in cells:
        s = cell.stats
        mode = "stream" if cell.stream else "whole"
        per_token = 1e3 * cell.cpu_ms_per_request / tokens if cell.stream else None
        triton = 1e3 * cell.triton_cpu_s / s.requests if s.requests else 0.0
        server = cell.cpu_ms_per_request
        lines.append(
            f"| {cell.engine} | {cell.endpoint} | {mode} | {cell.target} | {cell.concurrency} "
            f"| {s.rps:,.1f} | {s.ttft_ms[0]:.2f} / {s.ttft_ms[1]:.2f} "
            f"| {s.itl_ms[0]:.3f} / {s.itl_ms[1]:.3f} | {s.e2e_ms[0]:.2f} / {s.e2e_ms[1]:.2f} "
            f"| {_fmt(server)} | {_fmt(per_token if server else None, digits=0)} "
            f"| {triton:.2f} | {s.errors} |"
        )
    return lines


def markdown(meta: dict[str, Any], cells: Sequence[Cell]) -> str:
    """The whole report."""
    parts = [
        "# Serving overhead: direct Triton, this gateway, LiteLLM",
        "",
        f"{meta['date']}; {meta['machine']}; clients, servers and tritonserver on the same "
        f"machine; {meta['seconds_per_level']:g} s per level after a warm-up; "
        f"{meta['tokens']} tokens per request; gateway with auth and the rate limiter on, "
        f"one worker, to Triton over {meta.get('transport', 'http')}; LiteLLM "
        f"{meta['litellm_version']}, one worker. "
        "`loadtest` is the zero-compute load-test engine behind the stock ensemble; `tiny` is "
        "the tiny real model on the torch engine. CPU is per server process tree (from /proc); "
        "on the direct Triton rows it is the benchmark's own gRPC client (grpcio's asyncio "
        "API), the floor any Python client of Triton pays.",
        "",
        *headline(meta, cells),
        "",
        "![serving benchmark](bench-serving.png)",
        "",
        "## Every level",
        "",
        *detail(cells, meta["tokens"]),
        "",
    ]
    return "\n".join(parts)


def plot(cells: Sequence[Cell], path: Path) -> None:
    """Requests/s, first-token latency and server CPU against concurrency, per target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [
        ("streaming requests/s (completions)", lambda c: c.stats.rps, False),
        ("time to first token p50, ms (streaming)", lambda c: c.stats.ttft_ms[0], True),
        ("server CPU ms per streamed request", lambda c: c.cpu_ms_per_request, True),
    ]
    for axis, (title, value, log) in zip(axes, panels, strict=True):
        for target in TARGETS:
            if "CPU" in title and target in DIRECTS:
                continue
            points = [
                (c.concurrency, value(c))
                for c in cells
                if c.engine == "loadtest" and c.target == target and c.stream
                and c.endpoint == "completions"
            ]  # fmt: skip
            if points:
                color = f"C{TARGETS.index(target)}"
                axis.plot(*zip(*points, strict=True), marker="o", label=target, color=color)
        axis.set_xscale("log", base=2)
        if log:
            axis.set_yscale("log")
        axis.set_xlabel("concurrent clients")
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
    axes[0].legend()
    figure.suptitle("Zero-compute load-test engine, 16 tokens per request")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
