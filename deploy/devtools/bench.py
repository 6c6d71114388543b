"""Benchmark of the torch engine behind a real sidecar: readiness, tokens/s, batching gain, RSS."""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import Spec, parse_spec
from deploy.sidecar.supervisor import Sidecar

logger = logging.getLogger(__name__)

MODEL_NAME = "bench"
ENGINE_MODEL = f"{MODEL_NAME}_tensorrt_llm"
PROMPT = "The quick brown fox jumps over the lazy dog. Tell me a story about a small green house"
SPEED_UP_TARGET = 3.0


@dataclass(frozen=True)
class StreamResult:
    """One streamed generation as the client saw it."""

    tokens: int
    first_token_s: float
    total_s: float


@dataclass(frozen=True)
class Report:
    """The benchmark figures."""

    model_dir: str
    device: str
    new_tokens: int
    streams: int
    ready_s: float
    single_tokens_per_s: float
    single_first_token_ms: float
    concurrent_tokens_per_s: float
    concurrent_first_token_ms: float
    speed_up: float
    rss_mib: float
    rss_processes: int


def bench_spec(model_dir: str, device: str, dtype: str, max_batch_size: int) -> Spec:
    """One pipeline on the torch engine, in one sidecar."""
    engine = {
        "kind": "torch",
        "model_dir": model_dir,
        "device": device,
        "dtype": dtype,
        "max_batch_size": max_batch_size,
    }
    return parse_spec(
        {
            "models": [{"name": MODEL_NAME, "engine": engine}],
            "sidecars": [{"name": MODEL_NAME}],
        }
    )


def prompt_ids(model_dir: str) -> list[int]:
    """The benchmark prompt in the model's own tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return list(tokenizer.encode(PROMPT))


def _count_tokens(value: object) -> int:
    """Tokens in a JSON output: generate_stream turns a one-element tensor into a scalar."""
    if value is None:
        return 0
    if isinstance(value, list):
        return sum(_count_tokens(item) for item in value)
    return 1


def stream_generation(http_url: str, ids: list[int], new_tokens: int) -> StreamResult:
    """Stream one generation from the engine model over HTTP `generate_stream` (SSE)."""
    body = json.dumps(
        {
            "input_ids": ids,
            "input_lengths": len(ids),
            "request_output_len": new_tokens,
            "end_id": -1,
            "streaming": True,
        }
    )
    url = urllib.parse.urlsplit(http_url)
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=600)
    start = time.perf_counter()
    first = 0.0
    tokens = 0
    try:
        connection.request(
            "POST",
            f"/v2/models/{ENGINE_MODEL}/generate_stream",
            body,
            {"Content-Type": "application/json"},
        )
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"generate_stream answered {response.status}: {response.read()!r}")
        for line in response:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"generation failed: {event['error']}")
            count = _count_tokens(event.get("output_ids"))
            if count and not tokens:
                first = time.perf_counter() - start
            tokens += count
    finally:
        connection.close()
    return StreamResult(tokens, first, time.perf_counter() - start)


def concurrent_generations(
    http_url: str, ids: list[int], new_tokens: int, streams: int
) -> tuple[list[StreamResult], float]:
    """Run `streams` generations at once; returns each result and the wall time."""
    results: list[StreamResult | BaseException] = [RuntimeError("not run")] * streams

    def worker(index: int) -> None:
        try:
            results[index] = stream_generation(http_url, ids, new_tokens)
        except BaseException as exc:
            results[index] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    done: list[StreamResult] = []
    for result in results:
        if isinstance(result, BaseException):
            raise result
        done.append(result)
    return done, wall


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        kids.extend(int(p) for p in task.read_text().split())
    return kids


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def process_tree_rss(pid: int) -> tuple[float, int]:
    """Resident memory (MiB) of a process and all its descendants, and how many there are."""
    total, count, pending = 0, 0, [pid]
    while pending:
        current = pending.pop()
        try:
            total += _rss_kib(current)
            pending.extend(_children(current))
        except (FileNotFoundError, ProcessLookupError):
            continue
        count += 1
    return total / 1024, count


def measure(sidecar: Sidecar, ids: list[int], new_tokens: int, streams: int) -> dict[str, float]:
    """Single-stream and concurrent throughput against a ready sidecar."""
    url = sidecar.http_url
    stream_generation(url, ids, 8)
    singles = [stream_generation(url, ids, new_tokens) for _ in range(3)]
    single = statistics.median(r.tokens / r.total_s for r in singles)
    concurrent_generations(url, ids, 8, streams)
    results, wall = concurrent_generations(url, ids, new_tokens, streams)
    aggregate = sum(r.tokens for r in results) / wall
    return {
        "single_tokens_per_s": single,
        "single_first_token_ms": 1000 * statistics.median(r.first_token_s for r in singles),
        "concurrent_tokens_per_s": aggregate,
        "concurrent_first_token_ms": 1000 * statistics.median(r.first_token_s for r in results),
        "speed_up": aggregate / single,
    }


def run(args: argparse.Namespace) -> Report:
    """Start a sidecar for the model, measure it, stop it."""
    from deploy.sidecar.models import resolve_model_dir

    model_dir = resolve_model_dir(args.model_dir)
    spec = bench_spec(model_dir, args.device, args.dtype, max(args.streams, args.max_batch_size))
    ids = prompt_ids(model_dir)
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as workdir:
        sidecar = sidecar_from_spec(spec, spec.sidecars[0], Path(workdir))
        start = time.perf_counter()
        sidecar.start()
        ready_s = time.perf_counter() - start
        try:
            figures = measure(sidecar, ids, args.tokens, args.streams)
            rss_mib, processes = process_tree_rss(sidecar.pid or 0)
        finally:
            sidecar.stop()
    return Report(
        model_dir=model_dir,
        device=args.device,
        new_tokens=args.tokens,
        streams=args.streams,
        ready_s=ready_s,
        rss_mib=rss_mib,
        rss_processes=processes,
        **figures,
    )


def render(report: Report) -> str:
    """The report as aligned text lines."""
    verdict = "met" if report.speed_up >= SPEED_UP_TARGET else "NOT met"
    per_stream = report.concurrent_tokens_per_s / report.streams
    rows = [
        ("model", f"{report.model_dir} on {report.device}"),
        ("sidecar ready", f"{report.ready_s:.1f} s"),
        (
            "1 stream",
            f"{report.single_tokens_per_s:.0f} tokens/s "
            f"(first token {report.single_first_token_ms:.0f} ms)",
        ),
        (
            f"{report.streams} streams",
            f"{report.concurrent_tokens_per_s:.0f} tokens/s aggregate, {per_stream:.0f} per stream "
            f"(first token {report.concurrent_first_token_ms:.0f} ms)",
        ),
        (
            "in-flight speed-up",
            f"{report.speed_up:.1f}x at {report.streams} streams "
            f"(target >= {SPEED_UP_TARGET:.0f}x: {verdict})",
        ),
        ("sidecar RSS", f"{report.rss_mib:.0f} MiB in {report.rss_processes} processes"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def build_parser() -> argparse.ArgumentParser:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m deploy.devtools.bench", description=__doc__)
    parser.add_argument(
        "--model-dir", default="tiny", help="HF model folder or hub id, or tiny / smollm2"
    )
    parser.add_argument("--device", default="cpu", help="torch device of the engine")
    parser.add_argument("--dtype", default="auto", help="torch dtype of the engine")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per stream")
    parser.add_argument("--streams", type=int, default=16, help="concurrent streams")
    parser.add_argument("--max-batch-size", type=int, default=16, help="engine batch size")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    report = run(args)
    print(json.dumps(asdict(report), indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
