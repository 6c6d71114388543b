"""What every request a loaded gateway served went through, step by step: the marks of
``first_token_marks`` on every request (``FIRST_TOKEN_MARKS_EVERY``), read back from their folder.

The first-token probe marks its own requests, sent one at a time beside the load; this reads
the load's own requests, those whose time to first token the capacity benchmark reports::

    # the engine's side too: a .pth in the site-packages of the stubs' environment
    python tests/benchmarks/first_token_marks/first_token_engine_marks.py SITE_PACKAGES
    FIRST_TOKEN_MARKS=/tmp/marks FIRST_TOKEN_MARKS_EVERY=1 \\
        PYTHONPATH=$PWD:$PWD/tests/benchmarks/first_token_marks \\
        python -m tests.benchmarks.capacity --workers 8 --relay --levels 320
    python -m tests.benchmarks.marks_report /tmp/marks

Printed: the median gap before each step from a request's entry into the app to its end, the
engine's steps (``engine.accept``, ``engine.first_send``) among them where the Triton stubs
marked them too, and the Triton call of those requests split where the engine took and answered
it; the engine's own steps (reading the request, its prefill to the first output, the
response's turn to go, its send) for those requests and for direct Triton's of the same level
(the capacity benchmark measures direct first, so a direct request is counted with the endpoint
the gateway measured next); the time in the app to its first write (p50, p90, p99) over all
requests and per worker process (with the connections each held, and how late its event loop
ran what was ready); and per kept-alive connection, the gap from an answer's last write to the
next request's entry (the client's turn and the server's reading of it), and how often the next
request entered while the one before was still in the app (its settlement, metrics and access
line run after its last write).
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests.benchmarks.first_token import engine_marks, median_us, steps

Marks = dict[str, int]


@dataclass
class Run:
    """What one run's marks folder holds."""

    requests: dict[str, dict[str, Marks]] = field(default_factory=lambda: defaultdict(dict))
    """Every marked request without a probe's id that was answered, by its endpoint (``text``,
    ``chat``) and its ``any-<pid>-<serial>-<port>-<endpoint>`` key, with the engine's marks of
    its Triton call where the stubs left them (``engine.*``)."""
    loop_lags: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    """Each worker's samples of its event loop's lateness (ns), by its pid."""
    direct: dict[str, list[Marks]] = field(default_factory=lambda: defaultdict(list))
    """The marks of direct Triton's requests (the engine's, and the load generator's where it
    named them), by the endpoint of the gateway's requests that came next (the capacity
    benchmark measures direct first)."""


def load(folder: Path) -> Run:
    """The gateway's marks (``marks-*.jsonl``), the engine stubs' (``engine-*.jsonl``) and the
    load generator's of direct Triton's requests (``direct-*.jsonl``)."""
    engine, direct = engine_marks(folder)
    run = Run()
    for path in folder.glob("marks-*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if "loop" in entry:
                run.loop_lags[str(entry["loop"])] += entry["lags"]
                continue
            key = entry.pop("probe")
            entry.update(engine.get(entry.pop("triton_id", None), {}))
            if key.startswith("any-") and "first_body.send" in entry:
                run.requests[key.rsplit("-", 1)[1]][key] = entry
    starts = sorted(
        (min(m["asgi.entry"] for m in marks.values()), endpoint)
        for endpoint, marks in run.requests.items()
    )
    # Direct requests the load generator marked and named (``loadgen.DirectMarks``).
    for path in folder.glob("direct-*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            direct.append({**engine.get(entry.pop("triton_id"), {}), **entry})
    for entry in direct:
        if "engine.accept" not in entry:
            continue
        after = entry["engine.accept"]
        following = next((endpoint for start, endpoint in starts if start > after), None)
        if following is not None:
            run.direct[following].append(entry)
    return run


def _quantiles_us(values: list[int]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3

    return f"{at(0.5):,.0f} / {at(0.9):,.0f} / {at(0.99):,.0f}"


def report(marks: dict[str, Marks], loop_lags: dict[str, list[int]] | None = None) -> str:
    """The Markdown summary of ``marks`` (and of the workers' ``loop_lags``, where sampled)."""
    lags = loop_lags or {}
    by_connection: dict[tuple[str, str], list[Marks]] = defaultdict(list)
    for key, entry in marks.items():
        _, pid, _, port, _ = key.split("-")
        by_connection[(pid, port)].append(entry)
    in_app = [m["first_body.send"] - m["asgi.entry"] for m in marks.values()]
    # The steps every request takes, in order; a step only some take (a dial for want of a spare
    # connection) would put itself out of order among them, so it is counted apart.
    counts = Counter(name for m in marks.values() for name in m)
    usual = {name for name, count in counts.items() if 2 * count >= len(marks)}
    common = [{k: v for k, v in m.items() if k in usual} for m in marks.values()]
    lines = [
        f"{len(marks)} requests on {len(by_connection)} connections.",
        "",
        f"In the app to the first write, p50 / p90 / p99 µs: {_quantiles_us(in_app)}",
        "",
        "| step | µs |",
        "|---|---:|",
        *(f"| {name} | {us:,.0f} |" for name, us in steps(common, "asgi.entry")),
        "",
        *_triton_side(marks.values()),
        "| worker | connections | requests | in the app to the first write, p50 / p90 / p99 µs "
        "| event loop's lateness, p50 / p90 / p99 µs |",
        "|---|---:|---:|---:|---:|",
    ]
    workers: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for connection in by_connection:
        workers[connection[0]].append(connection)
    for pid, connections in sorted(workers.items(), key=lambda item: -len(item[1])):
        entries = [m for c in connections for m in by_connection[c]]
        firsts = [m["first_body.send"] - m["asgi.entry"] for m in entries]
        late = _quantiles_us(lags.get(pid, []))
        lines.append(
            f"| {pid} | {len(connections)} | {len(entries)} | {_quantiles_us(firsts)} | {late} |"
        )
    turns: list[int] = []
    overlaps: list[int] = []
    for entries in by_connection.values():
        entries.sort(key=lambda m: m["asgi.entry"])
        for before, after in itertools.pairwise(entries):
            if "last_body.send" in before:
                turns.append(after["asgi.entry"] - before["last_body.send"])
            if "asgi.exit" in before and after["asgi.entry"] < before["asgi.exit"]:
                overlaps.append(before["asgi.exit"] - after["asgi.entry"])
    share = f"{100 * len(overlaps) / len(turns):.0f}%" if turns else "-"
    dialled = sum(1 for m in marks.values() if "triton.dial.start" in m)
    lines += [
        "",
        f"From an answer's last write to the next request's entry on its connection, p50 / p90 / "
        f"p99 µs: {_quantiles_us(turns)} ({len(turns)} requests).",
        f"Next requests that entered while the one before was still in the app: {share}, by a "
        f"median of {median_us(overlaps):,.0f} µs.",
        f"Requests that found no spare connection to Triton and dialled one on their way: "
        f"{dialled} ({100 * dialled / len(marks):.1f}%).",
    ]
    return "\n".join(lines) + "\n"


TRITON_SIDE = (
    ("triton.written", "engine.accept", "into the engine (Triton's frontend, queue and stub)"),
    ("engine.accept", "engine.first_send.start", "the engine's prefill"),
    ("engine.first_send.start", "triton.arrived", "out to the worker's read callback"),
    ("triton.arrived", "first_body.send", "the worker, to the first write"),
    ("triton.written", "triton.arrived", "the request written to the answer's arrival"),
)


Steps = tuple[tuple[str, str, str], ...]


def _marked(marks: Iterable[Marks], steps: Steps) -> list[Marks]:
    """The requests that carry both marks of every step."""
    return [m for m in marks if all(a in m and b in m for a, b, _ in steps)]


def _durations_us(marks: list[Marks], start: str, end: str) -> str:
    return _quantiles_us([m[end] - m[start] for m in marks])


def _triton_side(marks: Iterable[Marks]) -> list[str]:
    """Where the engine marked the requests too: the time from the Triton request's write to its
    first answer's arrival in the worker, split where the engine took and answered it."""
    joined = _marked(marks, TRITON_SIDE)
    if not joined:
        return []
    lines = [
        f"The Triton call of {len(joined)} requests, as the engine marked it:",
        "",
        "| from | to | what | p50 / p90 / p99 µs |",
        "|---|---|---|---:|",
    ]
    for start, end, what in TRITON_SIDE:
        lines.append(f"| {start} | {end} | {what} | {_durations_us(joined, start, end)} |")
    return [*lines, ""]


ENGINE_STEPS = (
    ("engine.accept", "engine.parsed", "reading and checking the request"),
    ("engine.parsed", "engine.first_output", "the engine's prefill, to its first output"),
    ("engine.first_output", "engine.first_send.start", "the response built, its turn to go"),
    ("engine.first_send.start", "engine.first_send.end", "sending it (the stub's IPC)"),
)


def engine_steps(gateway: Iterable[Marks], direct: Iterable[Marks]) -> list[str]:
    """The engine's steps from a request's arrival in the model to its first response, for the
    gateway's requests and for direct Triton's of the same endpoint and load."""
    through, straight = _marked(gateway, ENGINE_STEPS), _marked(direct, ENGINE_STEPS)
    if not through and not straight:
        return []
    title = f"In the engine, {len(straight)} direct requests and {len(through)} through the gateway"
    return _beside(title, ENGINE_STEPS, straight, through)


CALL_STEPS = (
    ("triton.written", "engine.accept", "into the engine (Triton's frontend, queue and stub)"),
    ("engine.accept", "engine.first_send.start", "the engine's prefill"),
    ("engine.first_send.start", "triton.arrived", "out to the worker's (the client's) read"),
    ("triton.written", "triton.arrived", "the request written to the answer's arrival"),
)


def triton_calls(gateway: Iterable[Marks], direct: Iterable[Marks]) -> list[str]:
    """The Triton call, from the request's write to its first answer's arrival, of the
    gateway's requests beside direct Triton's (where the load generator marked its own)."""
    through, straight = _marked(gateway, CALL_STEPS), _marked(direct, CALL_STEPS)
    if not through or not straight:
        return []
    title = (
        f"The Triton call of {len(straight)} direct requests (written and read by the load "
        f"generator) and {len(through)} through the gateway (by its workers)"
    )
    return _beside(title, CALL_STEPS, straight, through)


def _beside(title: str, steps: Steps, direct: list[Marks], gateway: list[Marks]) -> list[str]:
    """A table of ``steps``, direct's durations beside the gateway's."""
    lines = [
        f"{title}, p50 / p90 / p99 µs:",
        "",
        "| from | to | what | direct | gateway |",
        "|---|---|---|---:|---:|",
    ]
    for start, end, what in steps:
        cells = " | ".join(_durations_us(ms, start, end) for ms in (direct, gateway))
        lines.append(f"| {start} | {end} | {what} | {cells} |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the FIRST_TOKEN_MARKS folder")
    args = parser.parse_args()
    run = load(args.folder)
    if not run.requests:
        raise SystemExit(f"no marked requests in {args.folder}")
    for endpoint, marks in sorted(run.requests.items(), reverse=True):
        print(f"## {endpoint}\n\n{report(marks, run.loop_lags)}")
        direct = run.direct.get(endpoint, [])
        print("\n".join(engine_steps(marks.values(), direct)))
        print("\n".join(triton_calls(marks.values(), direct)))
    every = [lag for lags in run.loop_lags.values() for lag in lags]
    print(
        f"The event loops' lateness over all workers, p50 / p90 / p99 µs: {_quantiles_us(every)}"
        f" ({len(every)} samples, one each 2 ms or later)."
    )


if __name__ == "__main__":
    main()
