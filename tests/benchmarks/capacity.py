"""Capacity: how many streamed tokens per second the gateway passes on, against direct Triton.

One tritonserver serves the PACED load-test engine (``engine: {kind: loadtest, token_s}``) as
the ``tensorrt_llm`` model: every stream gets a token each ``1/--rate`` seconds, the way a
TensorRT-LLM engine on a GPU streams, while the host spends almost nothing on it. The same
closed-loop load then rises from one stream to thousands against:

- ``direct``: Triton's HTTP ``generate_stream`` to the engine, the prompt's ids prebuilt;
- ``gateway-1``: ``triton-gateway serve`` with one worker, ``/v1/completions`` streamed, the
  engine entry (the gateway tokenizes and detokenizes), auth and the rate limiter on;
- ``gateway-N``: the same with ``--workers`` worker processes (limits in the embedded Redis);
- ``relay-N``: the floor of a Python hop (``tests/benchmarks/relay.py``): ``N`` uvicorn workers
  served as the gateway's are, relaying the direct request and Triton's events untouched, so the
  gateway's own cost is its distance from this row rather than from direct Triton.

The load comes from ``--clients`` processes, each an event loop of raw HTTP/1.1 clients. The
streams' first requests are spread over one request's paced length (``--arrivals staggered``),
as requests of varied lengths arrive; ``--arrivals burst`` starts them all at once, and with
equal lengths they then arrive together after every request. Per level: tokens/s (the tokens
that arrived in the ``--seconds`` while every stream was sending), time to first token and
inter-token latency p50/p99 (without the staggered first requests), errors, and the CPU of
each process tree (Triton, the gateway, the load generator itself, whose ceiling shows in its
own row). Chat completions run at a few levels too, against direct Triton given the ids of the
templated conversation the gateway sends (longer than the bare prompt, so the engine's paced
prompt time is longer too). Markdown, JSON and a plot go to ``--out``.

Run on the GPU host from the offline bundle (``make capacity``); it needs no GPU, only cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from deploy.sidecar.models import ensure_tiny_model
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar, free_port, sidecar_from_spec
from gateway.catalog.text.hub import load_tokenizer
from gateway.catalog.text.prompts import PromptTokenizer
from gateway.tenancy.keys import digest
from tests.benchmarks.loadgen import HttpClient, Sample, run_level
from tests.benchmarks.serving import cpu_seconds
from tests.support.gateway import serve_process, stop_process

KEY = "tgw-capacity-0123456789abcdef0123456789abcdef"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
LEVELS = (1, 8, 32, 64, 128, 192, 256, 320, 384, 512, 768, 1024, 1536)
CHAT_LEVELS = (64, 320, 1024)
_ARRIVALS = {
    "staggered": "the streams' first requests spread over one request's length (not measured)",
    "burst": "every stream starting at once and staying in step (all requests arrive together)",
}


@dataclass(frozen=True)
class Row:
    """One target at one level."""

    target: str
    endpoint: str
    streams: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    requests: int
    errors: int
    first_error: str | None
    cpu: dict[str, float]
    """Cores used by each process tree during the level."""


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


Result = tuple[float, float, float, int, list[float], str | None, bool]
"""A request: start, first token, end, tokens, gaps between tokens, error, whether a ramp."""


def _arrivals(result: Result, since: float, until: float) -> int:
    """How many of a request's tokens arrived between ``since`` and ``until``."""
    if not result[3]:
        return 0
    times = itertools.accumulate(result[4], initial=result[1])
    return sum(1 for t in times if since <= t <= until)


def _client_main(job: dict[str, Any]) -> tuple[list[Result], float]:
    """One load-generator process: ``job["streams"]`` clients for ``job["seconds"]``; its
    samples and the CPU seconds it spent."""

    async def run() -> list[Sample]:
        async def connect() -> Any:
            client = HttpClient(
                job["host"], job["port"], job["path"], job["body"], KEY,
                is_token=_direct_token if job["direct"] else None,
                ends_with_done=not job["direct"],
            )  # fmt: skip
            return client.send

        # A stream that never ends is an error of its own, not a hung level.
        samples, _ = await run_level(
            connect, job["streams"], job["seconds"], 120.0, job["stagger_s"], job["phase"]
        )
        return samples

    cpu = time.process_time()
    samples = asyncio.run(run())
    cpu = time.process_time() - cpu
    return [(s.start, s.first, s.end, s.tokens, s.gaps, s.error, s.ramp) for s in samples], cpu


def _direct_token(data: bytes) -> bool:
    return b'"output_ids"' in data


def _spread(total: int, parts: int) -> list[int]:
    share = [total // parts] * parts
    for index in range(total % parts):
        share[index] += 1
    return [s for s in share if s]


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def measure(
    target: str,
    endpoint: str,
    url: str,
    job: dict[str, Any],
    streams: int,
    args: argparse.Namespace,
    trees: dict[str, int],
) -> Row:
    host, port = url.removeprefix("http://").split(":")
    shares = _spread(streams, args.clients)
    stagger_s = args.tokens / args.rate if args.arrivals == "staggered" else 0.0
    jobs = [
        {**job, "host": host, "port": int(port), "streams": share, "seconds": args.seconds,
         "stagger_s": stagger_s, "phase": index / len(shares)}
        for index, share in enumerate(shares)
    ]  # fmt: skip
    context = multiprocessing.get_context("spawn")
    with context.Pool(len(jobs)) as pool:
        warm = [{**j, "seconds": args.warmup, "stagger_s": 0.0} for j in jobs]
        pool.map(_client_main, warm)
        before = _cpu(trees)
        started = time.perf_counter()
        results = pool.map(_client_main, jobs)
        wall = time.perf_counter() - started
        after = _cpu(trees)
    # Tokens/s counts the tokens that arrived while every stream was sending; latencies leave
    # out each staggered stream's first request, sent while the others were still starting.
    window = (started + stagger_s, started + stagger_s + args.seconds)
    arrived = sum(_arrivals(s, *window) for part, _ in results for s in part if s[5] is None)
    every = [s for part, _ in results for s in part]
    good = [s for s in every if s[5] is None and not s[6]]
    errors = [s[5] for s in every if s[5] is not None]
    cpu = {name: (after[name] - before[name]) / wall for name in trees}
    cpu["load generator"] = sum(spent for _, spent in results) / wall
    gaps = [gap for s in good for gap in s[4]]
    row = Row(
        target=target,
        endpoint=endpoint,
        streams=streams,
        tokens_per_s=arrived / args.seconds,
        ttft_p50_ms=1e3 * _quantile([s[1] - s[0] for s in good], 0.5),
        ttft_p99_ms=1e3 * _quantile([s[1] - s[0] for s in good], 0.99),
        itl_p50_ms=1e3 * _quantile(gaps, 0.5),
        itl_p99_ms=1e3 * _quantile(gaps, 0.99),
        requests=len(good),
        errors=len(errors),
        first_error=errors[0] if errors else None,
        cpu=cpu,
    )
    print(
        f"{target:10s} {endpoint:5s} {streams:5d} streams {row.tokens_per_s:9,.0f} tok/s "
        f"TTFT p50 {row.ttft_p50_ms:7.1f} ms ITL p50 {row.itl_p50_ms:6.2f} p99 "
        f"{row.itl_p99_ms:6.2f} ms errors {row.errors} cores "
        + " ".join(f"{k}={v:.1f}" for k, v in cpu.items()),
        flush=True,
    )
    return row


def start_triton(
    args: argparse.Namespace, tokenizer: Path, workdir: Path, token_id: int
) -> Sidecar:
    """The paced engine answering ``token_id`` throughout: a word, so that every token is text
    for every endpoint (the prompt's own ids would echo a chat template's special tokens, which
    a chat stream rightly shows as nothing, a gap the direct path does not count)."""
    engine = {
        "kind": "loadtest",
        "token_id": token_id,
        "tokenizer_dir": str(tokenizer),
        "token_s": 1.0 / args.rate,
        "prompt_token_s": args.prompt_token_s,
        "instances": args.instances,
    }
    model = {"name": "lt", "release": "latest", "engine": engine, "triton_max_batch_size": 256}
    if args.text_env:
        model["text_python_env"] = args.text_env
    spec = parse_spec({"models": [model], "sidecars": [{"name": "capacity"}]})
    sidecar = sidecar_from_spec(spec, spec.sidecars[0], workdir)
    sidecar.start()
    return sidecar


def gateway_config(sidecar: Sidecar, tokenizer: Path, workers: int) -> dict[str, Any]:
    model = {"name": "lt", "triton_url": sidecar.grpc_url, "triton_http_url": sidecar.http_url,
             "triton_model": "lt_tensorrt_llm", "entry": "tensorrt_llm",
             "tokenizer_dir": str(tokenizer), "context_length": 4096}  # fmt: skip
    tenant = {"name": "bench", "requests_per_minute": 10_000_000, "tokens_per_minute": 10**12}
    return {
        "models": [model],
        "tenancy": {"tenants": [tenant], "keys": [{"tenant": "bench", "sha256": digest(KEY)}]},
        "server": {"workers": workers},
        "limits": {"request_timeout_s": 600},
        "log_level": "WARNING",
    }


@contextlib.contextmanager
def relay_process(
    sidecar: Sidecar, body: dict[str, Any], workdir: Path, workers: int
) -> Iterator[tuple[str, int]]:
    """``tests.benchmarks.relay`` with ``workers`` workers in front of the sidecar, once every
    worker listens: its URL and process id."""
    body_path = workdir / "relay-body.json"
    body_path.write_text(json.dumps(body))
    port = free_port()
    triton = sidecar.http_url.removeprefix("http://")
    command = [sys.executable, "-m", "tests.benchmarks.relay", "--triton", triton, "--model",
               "lt_tensorrt_llm", "--body", str(body_path), "--port", str(port), "--workers",
               str(workers)]  # fmt: skip
    with (workdir / f"relay-{workers}.log").open("wb") as log:
        # A session of its own: the workers go with it even if the parent hangs.
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        answered: set[str] = set()
        # Every worker listening: each new connection lands on one, as the kernel spreads them.
        while len(answered) < workers:
            if process.poll() is not None or time.monotonic() > deadline:
                log_text = (workdir / f"relay-{workers}.log").read_text(errors="replace")
                raise RuntimeError(f"the relay did not start: {log_text}")
            answer = _answer(f"{url}/ready")
            if answer is None:
                time.sleep(0.2)
            else:
                answered.add(answer)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _answer(url: str) -> str | None:
    """The body of a 200 answer on a new connection, or None."""
    try:
        answer = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None
    return answer.text if answer.status_code == 200 else None


def chat_ids(vocabulary: Any) -> list[int]:
    """The prompt's ids as the gateway sends a chat of it: templated and tokenized by the
    gateway's own prompt tokenizer."""
    with ThreadPoolExecutor(1) as executor:
        prompts = PromptTokenizer(vocabulary, executor)
        prompt = asyncio.run(prompts.chat_prompt([{"role": "user", "content": PROMPT}]))
    return list(prompt.ids)


def run(args: argparse.Namespace) -> dict[str, Any]:
    tokenizer = Path(args.tokenizer) if args.tokenizer else ensure_tiny_model()
    vocabulary = load_tokenizer(str(tokenizer))
    ids = vocabulary.encode(PROMPT, add_special_tokens=True)
    templated = chat_ids(vocabulary)
    word = vocabulary.encode(" the", add_special_tokens=False)[-1]
    workdir = Path(tempfile.mkdtemp(prefix="capacity-"))
    sidecar = start_triton(args, tokenizer, workdir, word)
    rows: list[Row] = []
    direct = {"path": "/v2/models/lt_tensorrt_llm/generate_stream", "direct": True,
              "body": {"input_ids": list(ids), "input_lengths": [len(ids)],
                       "request_output_len": [args.tokens], "streaming": [True]}}  # fmt: skip
    # A chat's prompt is the templated conversation: longer, so its engine time is longer too.
    direct_chat = {**direct, "body": {**direct["body"], "input_ids": templated,
                                      "input_lengths": [len(templated)]}}  # fmt: skip
    completion = {"path": "/v1/completions", "direct": False,
                  "body": {"model": "lt", "prompt": PROMPT, "max_tokens": args.tokens,
                           "stream": True, "stream_options": {"include_usage": True}}}  # fmt: skip
    chat = {"path": "/v1/chat/completions", "direct": False,
            "body": {"model": "lt", "messages": [{"role": "user", "content": PROMPT}],
                     "max_tokens": args.tokens, "stream": True,
                     "stream_options": {"include_usage": True}}}  # fmt: skip
    try:
        trees = {"triton": sidecar.pid or 0}
        for streams in args.levels:
            rows.append(measure("direct", "text", sidecar.http_url, direct, streams, args, trees))
        for streams in (s for s in CHAT_LEVELS if s in args.levels):
            rows.append(
                measure("direct", "chat", sidecar.http_url, direct_chat, streams, args, trees)
            )
        for workers in args.relay if args.relay is not None else [max(args.workers)]:
            with relay_process(sidecar, direct["body"], workdir, workers) as (url, pid):
                trees = {"triton": sidecar.pid or 0, "gateway": pid}
                for streams in args.levels:
                    rows.append(measure(f"relay-{workers}", "text", url, direct, streams, args,
                                        trees))  # fmt: skip
        for workers in args.workers:
            name = f"gateway-{workers}"
            url, process = serve_process(gateway_config(sidecar, tokenizer, workers), workdir,
                                         name, timeout_s=180)  # fmt: skip
            trees = {"triton": sidecar.pid or 0, "gateway": process.pid}
            try:
                for streams in args.levels:
                    rows.append(measure(name, "text", url, completion, streams, args, trees))
                for streams in (s for s in CHAT_LEVELS if s in args.levels):
                    rows.append(measure(name, "chat", url, chat, streams, args, trees))
            finally:
                stop_process(process)
    finally:
        sidecar.stop()
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
            "prompt_tokens": len(ids),
            "chat_prompt_tokens": len(templated),
            "engine_instances": args.instances,
            "seconds_per_level": args.seconds,
            "client_processes": args.clients,
            "arrivals": args.arrivals,
        },
        "rows": [asdict(row) for row in rows],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(".bench/results"))
    parser.add_argument("--rate", type=float, default=80.0, help="tokens/s per stream")
    parser.add_argument("--prompt-token-s", type=float, default=0.00005)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--instances", type=int, default=8, help="engine instances")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--relay",
        type=int,
        nargs="*",
        help="worker counts of the relay, the floor of a Python hop (tests/benchmarks/relay.py; "
        "default: the most gateway workers; none: no relay)",
    )
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=max(1, (os.cpu_count() or 2) // 4))
    parser.add_argument(
        "--arrivals",
        choices=("staggered", "burst"),
        default="staggered",
        help="staggered: the streams' first requests spread over one request's paced length, as "
        "requests of varied lengths arrive; burst: every stream starts at once, and with equal "
        "lengths they stay in step, all arriving together again after every request",
    )
    parser.add_argument("--tokenizer", help="tokenizer folder (default: the tiny model's)")
    parser.add_argument("--text-env", help="text_python_env of the sidecar (numpy < 2)")
    args = parser.parse_args()
    report = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"capacity-{report['machine']['cpus']}cpu"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    stem.with_suffix(".md").write_text(render_markdown(report))
    render_plot(report, stem.with_suffix(".png"))
    print(render_markdown(report))


if __name__ == "__main__":
    main()
