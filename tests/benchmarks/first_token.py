"""Where the gateway's time to first token goes: one stream at a time, step by step.

The capacity benchmark measures how much the gateway adds to Triton's time to first token; this
one shows where it goes. One tritonserver serves the paced load-test engine (as in
``tests.benchmarks.capacity``); one client sends streamed requests one at a time, over kept-alive
connections, alternating between direct Triton (``generate_stream`` with the prompt's ids), the
gateway's ``/v1/completions`` and its ``/v1/chat/completions``, a pause between requests. The
gateway runs as ``triton-gateway serve`` (``--workers``; auth and the rate limiter on, limits in
the embedded Redis from two workers) with the marks of ``first_token_marks/sitecustomize.py``,
which note when each request reached each step of its path; they are joined to the client's
send and first-token times by a request header. With ``--background N``, N more streams of the
capacity benchmark's completions (128 tokens each, from ``--clients`` processes) run through the
gateway the whole time, so the steps show what a request meets on a loaded gateway and a loaded
Triton; the direct probes then see the same Triton load. The step times are medians of the
gaps between consecutive marks, in the order a request meets them: what a request pays at each
step on an otherwise idle host (cold caches and idle cores included), or beside the background
load, not what the code costs in a loop.

    python -m tests.benchmarks.first_token --workers 8 --requests 60
    python -m tests.benchmarks.first_token --workers 8 --requests 60 --background 320
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import re
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from deploy.sidecar.models import ensure_tiny_model
from gateway.catalog.text.hub import load_tokenizer
from tests.benchmarks import capacity_load
from tests.benchmarks.capacity_setup import ENGINE_MODEL, KEY, PROMPT, gateway_config, start_triton
from tests.benchmarks.loadgen import has_output_ids
from tests.support.gateway import serve_process, stop_process

MARKS = Path(__file__).parent / "first_token_marks"
_TEXT = re.compile(rb'"(?:text|content)":"[^"]')
"""An OpenAI chunk with text: a non-empty ``text`` or ``content``."""


class Client:
    """One kept-alive connection sending one streamed request at a time, timing its first
    token (a Triton event with ids, or an OpenAI chunk with text)."""

    def __init__(self, url: str, path: str, body: dict[str, Any], direct: bool) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        payload = json.dumps(body).encode()
        self._head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: {len(payload)}\r\n"
        ).encode()
        self._payload = payload
        self._address = (host, int(port))
        self._direct = direct
        self._socket: socket.socket | None = None

    def send(self, probe: str) -> tuple[int, int]:
        """Send once, read the whole answer; the send and first-token times (monotonic ns)."""
        if self._socket is None:
            self._socket = socket.create_connection(self._address)
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = self._head + f"x-probe-id: {probe}\r\n\r\n".encode() + self._payload
        sent = time.monotonic_ns()
        self._socket.sendall(request)
        first = 0
        received = b""
        while not received.endswith(b"\r\n0\r\n\r\n"):
            data = self._socket.recv(1 << 16)
            if not data:
                self._socket = None
                raise ConnectionError("the server closed the connection")
            received += data
            if not first and self._is_token(received):
                first = time.monotonic_ns()
        return sent, first

    def _is_token(self, received: bytes) -> bool:
        if self._direct:
            return has_output_ids(received)
        return _TEXT.search(received) is not None


def median_us(values: list[int]) -> float:
    return statistics.median(values) / 1e3 if values else float("nan")


def steps(marks: list[dict[str, int]], origin: str = "client.send") -> list[tuple[str, float]]:
    """The median gap before each mark, in the order of their median times after ``origin``."""
    order = sorted(
        {name for m in marks for name in m},
        key=lambda name: statistics.median(m[name] - m[origin] for m in marks if name in m),
    )
    gaps = []
    for before, after in itertools.pairwise(order):
        values = [m[after] - m[before] for m in marks if before in m and after in m]
        gaps.append((f"{before} → {after}", median_us(values)))
    return gaps


def run(args: argparse.Namespace) -> str:
    tokenizer = Path(args.tokenizer) if args.tokenizer else ensure_tiny_model()
    vocabulary = load_tokenizer(str(tokenizer))
    ids = vocabulary.encode(PROMPT, add_special_tokens=True)
    word = vocabulary.encode(" the", add_special_tokens=False)[-1]
    engine = argparse.Namespace(
        rate=80.0, prompt_token_s=0.00005, instances=8, senders=4, text_env=args.text_env
    )
    workdir = Path(tempfile.mkdtemp(prefix="first-token-"))
    marks_dir = workdir / "marks"
    marks_dir.mkdir()
    sidecar = start_triton(engine, tokenizer, workdir, word)
    tokens = args.tokens
    direct = {"input_ids": list(ids), "input_lengths": [len(ids)],
              "request_output_len": [tokens], "streaming": [True]}  # fmt: skip
    openai = {"model": "lt", "max_tokens": tokens, "stream": True}
    sent: dict[str, tuple[int, int]] = {}
    environment = dict(os.environ)
    try:
        os.environ["FIRST_TOKEN_MARKS"] = str(marks_dir)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(MARKS), *filter(None, [environment.get("PYTHONPATH")])]
        )
        config = gateway_config(sidecar, tokenizer, args.workers)
        url, process = serve_process(config, workdir, "gateway", timeout_s=180)
    finally:
        os.environ.clear()
        os.environ.update(environment)
    background: tuple[Any, Any, float] | None = None
    try:
        engine_path = f"/v2/models/{ENGINE_MODEL}/generate_stream"
        clients = {
            "direct": Client(sidecar.http_url, engine_path, direct, True),
            "completions": Client(url, "/v1/completions",
                                  {**openai, "prompt": PROMPT}, False),
            "chat": Client(url, "/v1/chat/completions",
                           {**openai, "messages": [{"role": "user", "content": PROMPT}]},
                           False),
        }  # fmt: skip
        background = _background(args, url)
        for index in range(args.warmup + args.requests):
            for name, client in clients.items():
                probe = f"{name}-{index}"
                times = client.send(probe)
                if index >= args.warmup:
                    sent[probe] = times
                time.sleep(args.pause)
        if background is not None:
            pool, load, seconds = background
            if load.ready():
                raise RuntimeError("the background load ended before the probes did")
            parts = load.get(timeout=seconds + 150.0)
            errors = sum(1 for part, _ in parts for sample in part if sample[5] is not None)
            pool.close()
            if errors:
                raise RuntimeError(f"{errors} background requests failed")
    finally:
        if background is not None:
            background[0].terminate()
        stop_process(process)
        sidecar.stop()
    return report(args, sent, probe_marks(marks_dir))


def engine_marks(folder: Path) -> tuple[dict[str, dict[str, int]], list[dict[str, int]]]:
    """The engine stubs' marks (``engine-*.jsonl``): those of requests with a Triton id, by it,
    and those of requests without one (direct Triton's)."""
    by_id: dict[str, dict[str, int]] = {}
    anonymous: list[dict[str, int]] = []
    for path in folder.glob("engine-*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            triton_id = entry.pop("triton_id")
            if triton_id:
                by_id[triton_id] = entry
            else:
                anonymous.append(entry)
    return by_id, anonymous


def probe_marks(folder: Path) -> dict[str, dict[str, int]]:
    """Each probe's marks, with the engine's marks of its Triton call where the stubs left them
    (joined by the Triton request id); the event loops' samples left out."""
    engine, _ = engine_marks(folder)
    marks: dict[str, dict[str, int]] = {}
    for path in folder.glob("marks-*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if "probe" in entry:
                entry.update(engine.get(entry.pop("triton_id", None), {}))
                marks[entry.pop("probe")] = entry
    return marks


def _background(args: argparse.Namespace, url: str) -> tuple[Any, Any, float] | None:
    """``--background`` streams of 128-token completions through the gateway, for longer than
    the probes take (their pool, pending result and seconds); under way before the probes
    start. The probes check that it still runs when they end."""
    if not args.background:
        return None
    host, port = url.removeprefix("http://").rsplit(":", 1)
    per_probe_s = args.pause + args.tokens / 80.0 + 0.05
    seconds = 1.5 * 3 * (args.warmup + args.requests) * per_probe_s + 10.0
    job = {"host": host, "port": int(port), "path": "/v1/completions", "direct": False,
           "body": {"model": "lt", "prompt": PROMPT, "max_tokens": 128, "stream": True},
           "seconds": seconds, "stagger_s": 128 / 80.0, "think_s": 0.0}  # fmt: skip
    shares = [s for s in capacity_load.spread(args.background, args.clients) if s]
    jobs = [{**job, "streams": share, "phase": i / len(shares)} for i, share in enumerate(shares)]
    pool = multiprocessing.get_context("spawn").Pool(len(jobs))
    try:
        load = pool.map_async(capacity_load.client_main, jobs)
        time.sleep(5.0)
    except BaseException:
        pool.terminate()
        raise
    return pool, load, seconds


def report(
    args: argparse.Namespace, sent: dict[str, tuple[int, int]], marks: dict[str, dict[str, int]]
) -> str:
    ttft = {
        name: median_us([first - start for probe, (start, first) in sent.items()
                          if probe.startswith(f"{name}-")])
        for name in ("direct", "completions", "chat")
    }  # fmt: skip
    lines = [
        "# Where the first token's time goes, one stream"
        + (f" beside {args.background} background streams" if args.background else ""),
        "",
        f"{time.strftime('%Y-%m-%d %H:%M')}; {os.cpu_count()} CPUs; `python -m "
        f"tests.benchmarks.first_token --workers {args.workers} --requests {args.requests}"
        f"{f' --background {args.background}' if args.background else ''}`: "
        f"{args.requests} requests each, one at a time, {args.pause * 1000:.0f} ms apart; "
        f"{args.tokens} tokens at 80 tokens/s.",
        "",
        "| target | TTFT p50 | added to direct |",
        "|---|---:|---:|",
    ]
    for name, value in ttft.items():
        added = "-" if name == "direct" else f"+{(value - ttft['direct']) / 1000:.2f} ms"
        lines.append(f"| {name} | {value / 1000:.2f} ms | {added} |")
    for name in ("completions", "chat"):
        joined = [
            {**marks[probe], "client.send": start, "client.first_token": first}
            for probe, (start, first) in sent.items()
            if probe.startswith(f"{name}-") and probe in marks
        ]
        lines += ["", f"## {name}: median time between steps", "", "| step | µs |", "|---|---:|"]
        lines += [f"| {step} | {micros:.0f} |" for step, micros in steps(joined)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(".bench/results"))
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--requests", type=int, default=60, help="measured requests per target")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between requests")
    parser.add_argument("--tokenizer", help="tokenizer folder (default: the tiny model's)")
    parser.add_argument("--text-env", help="text_python_env of the sidecar (numpy < 2)")
    parser.add_argument(
        "--background", type=int, default=0, help="streams of load through the gateway meanwhile"
    )
    parser.add_argument("--clients", type=int, default=max(1, (os.cpu_count() or 2) // 4))
    args = parser.parse_args()
    text = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = f"-background-{args.background}" if args.background else ""
    (args.out / f"first-token-{os.cpu_count()}cpu{suffix}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
