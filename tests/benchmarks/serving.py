"""``make bench``: serving overhead of this gateway and of LiteLLM's proxy against direct Triton.

One tritonserver serves two pipelines: ``loadtest`` (the zero-compute load-test engine behind the
stock ensemble, so only serving costs show) and ``tiny`` (the tiny real model on the torch
engine). In ONE run the same closed-loop clients drive, at each concurrency:

1. direct Triton: gRPC ``ModelStreamInfer``, one prebuilt request, to the ensemble and to the
   ``tensorrt_llm`` model (the floor of each gateway entry);
2. this gateway (``triton-gateway serve``, auth and rate limiter on) over the ensemble entry, and
   over the ``tensorrt_llm`` entry (the gateway tokenizes and detokenizes itself);
3. LiteLLM's proxy (pinned, its own virtualenv, ``triton/`` provider to the ensemble's generate
   endpoints, one worker).

Figures: requests/s; time to first token, inter-token latency and end-to-end p50/p99; server CPU
per request and per streamed token from ``/proc`` (each server's process tree; for direct
Triton, the benchmark's own gRPC client: the floor any asyncio Python client of Triton pays);
RSS. Written to ``--out`` (default ``.bench/results``, untracked) as ``bench-serving.{md,json,png}``
and printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import numpy as np
import psutil

from adapters.triton.grpc.stream import infer_request
from adapters.triton.wire import WireTensor
from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.models import ensure_tiny_model
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from gateway.catalog.text.hub import load_tokenizer
from gateway.tenancy.service import digest
from tests.benchmarks import litellm_proxy
from tests.benchmarks import report as bench_report
from tests.benchmarks.loadgen import HttpClient, Sample, TritonStreamClient, run_level, summarize
from tests.benchmarks.report import Cell
from tests.support import REPO
from tests.support.gateway import serve_process, stop_process

LEVELS = (1, 8, 32, 128)
TOKENS = 16
KEY = "sk-bench-0123456789abcdef0123456789abcdef"
PROMPT = "The quick brown fox jumps over the lazy dog"
RESULTS = REPO / ".bench" / "results"
"""Where reports go by default: untracked; ``--out results`` updates the committed ones."""


def bench_spec(tokenizer_dir: Path) -> Any:
    """The load-test pipeline and the tiny real model, in one sidecar."""
    return parse_spec(
        {
            "models": [
                {
                    "name": "loadtest",
                    "release": "latest",
                    "engine": {"kind": "loadtest", "tokenizer_dir": str(tokenizer_dir)},
                    "triton_max_batch_size": 256,
                },
                {
                    "name": "tiny",
                    "release": "latest",
                    "engine": {"kind": "torch", "model_dir": str(tokenizer_dir)},
                },
            ],
            "sidecars": [{"name": "bench"}],
        }
    )


def gateway_config(
    sidecar: Sidecar, tokenizer_dir: Path, transport: str = "grpc"
) -> dict[str, Any]:
    """Every pipeline through both entries; auth on and a rate limiter that admits everything.
    ``transport``: how the gateway reaches Triton, ``http`` (``generate_stream``) or ``grpc``."""

    def model(name: str, pipeline: str, entry: str) -> dict[str, Any]:
        return {
            "name": name,
            "triton_url": sidecar.grpc_url,
            "transport": transport,
            **({"triton_http_url": sidecar.http_url} if transport == "http" else {}),
            "triton_model": f"{pipeline}_{entry}",
            "engine_model": f"{pipeline}_tensorrt_llm",
            "entry": entry,
            "tokenizer_dir": str(tokenizer_dir),
            # The sidecar's preprocessing reads this folder: the gateway's count of a prompt is
            # the engine's, as for a pipeline of the gateway's own sidecars.
            "count_prompts": True,
        }

    unlimited = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12}
    return {
        "models": [
            model(f"{pipeline}{suffix}", pipeline, entry)
            for pipeline in ("loadtest", "tiny")
            for suffix, entry in (("", "ensemble"), ("-engine", "tensorrt_llm"))
        ],
        "tenancy": {
            "auth": True,
            "tenants": [{"name": "bench", **unlimited}],
            "keys": [{"tenant": "bench", "sha256": digest(KEY)}],
            # Counted in this process, as the direct path counts nothing shared either.
            "store": {"kind": "memory"},
        },
    }


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU of a process tree so far."""
    total = 0.0
    for process in process_tree(pid):
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def rss_mib(pid: int) -> float:
    """Resident memory of a process tree."""
    total = 0
    for process in process_tree(pid):
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


def http_body(endpoint: str, model: str, stream: bool, tokens: int = TOKENS) -> dict[str, Any]:
    """The same request for every HTTP target: 16 tokens (or ``tokens``) of a short prompt."""
    body: dict[str, Any] = {"model": model, "max_tokens": tokens, "stream": stream}
    if stream:
        # Tokens joined into one chunk under backpressure are counted from the usage.
        body["stream_options"] = {"include_usage": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    return body


def direct_request(model: str, stream: bool) -> Any:
    """The prebuilt gRPC request to the ensemble, as the gateway would build it."""
    tensors = [
        WireTensor("text_input", "BYTES", np.array([[PROMPT.encode()]], dtype=object)),
        WireTensor("max_tokens", "INT32", np.array([[TOKENS]], dtype=np.int32)),
        WireTensor("stream", "BOOL", np.array([[stream]], dtype=np.bool_)),
    ]
    return infer_request(model, "bench", tensors, ["text_output"])


def direct_engine_request(model: str, stream: bool, tokenizer_dir: Path) -> Any:
    """The prebuilt gRPC request to the ``tensorrt_llm`` model: the prompt's token ids."""
    tokenizer = load_tokenizer(str(tokenizer_dir))
    ids = tokenizer.encode(PROMPT, add_special_tokens=True)
    end_id = tokenizer.token_id(tokenizer.special_tokens.get("eos_token"))

    def scalar(name: str, value: int, dtype: Any = np.int32) -> WireTensor:
        datatype = "BOOL" if dtype is np.bool_ else "INT32"
        return WireTensor(name, datatype, np.array([[value]], dtype=dtype))

    tensors = [
        WireTensor("input_ids", "INT32", np.array([ids], dtype=np.int32)),
        scalar("input_lengths", len(ids)),
        scalar("request_output_len", TOKENS),
        scalar("streaming", stream, np.bool_),
    ]
    if end_id is not None:
        tensors += [scalar("end_id", end_id), scalar("pad_id", end_id)]
    return infer_request(model, "bench", tensors, ["output_ids", "sequence_length"])


class Bench:
    """Runs every target at every level against one sidecar, collecting cells."""

    def __init__(self, sidecar: Sidecar, seconds: float, levels: tuple[int, ...]) -> None:
        self.sidecar = sidecar
        self.seconds = seconds
        self.levels = levels
        self.cells: list[Cell] = []
        self.litellm_rss: float | None = None

    async def measure(
        self,
        engine: str,
        target: str,
        endpoint: str,
        stream: bool,
        connect: Callable[[], Awaitable[Callable[[Sample], Awaitable[None]]]],
        server_pid: int | None,
    ) -> None:
        """Each level: a short warm-up, then ``seconds`` measured.

        CPU is the server's process tree, or with no server (direct Triton) this process: the
        gRPC client's own cost.
        """
        triton_pid = self.sidecar.pid
        assert triton_pid is not None
        for level in self.levels:
            await run_level(connect, level, min(0.5, self.seconds))
            cpu = cpu_seconds(server_pid) if server_pid else time.process_time()
            triton = cpu_seconds(triton_pid)
            samples, elapsed = await run_level(connect, level, self.seconds)
            cell = Cell(
                engine=engine,
                target=target,
                endpoint=endpoint,
                stream=stream,
                concurrency=level,
                stats=summarize(samples, elapsed),
                cpu_s=(cpu_seconds(server_pid) if server_pid else time.process_time()) - cpu,
                triton_cpu_s=cpu_seconds(triton_pid) - triton,
            )
            self.cells.append(cell)
            bench_report.print_cell(cell)

    async def direct(self, engine: str, model: str, tokenizer_dir: Path | None = None) -> None:
        """Direct Triton gRPC, streamed and whole, on one channel: to the ensemble, or to the
        ``tensorrt_llm`` model when ``tokenizer_dir`` gives the prompt's ids."""
        target = bench_report.DIRECT if tokenizer_dir is None else bench_report.DIRECT_ENGINE
        async with grpc.aio.insecure_channel(self.sidecar.grpc_url) as channel:
            for stream in (False, True):
                if tokenizer_dir is None:
                    request = direct_request(model, stream)
                else:
                    request = direct_engine_request(model, stream, tokenizer_dir)

                async def connect(request: Any = request) -> Callable[[Sample], Awaitable[None]]:
                    return TritonStreamClient(channel, request).send

                await self.measure(engine, target, "completions", stream, connect, None)

    async def http(
        self, engine: str, target: str, url: str, model: str, pid: int, endpoints: tuple[str, ...]
    ) -> None:
        """An OpenAI-compatible server: both endpoints, whole and streamed."""
        host, port = url.removeprefix("http://").split(":")
        for endpoint in endpoints:
            path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
            for stream in (False, True):
                body = http_body(endpoint, model, stream)

                async def connect(body: Any = body, path: str = path) -> Any:
                    return HttpClient(host, int(port), path, body, KEY).send

                await self.measure(engine, target, endpoint, stream, connect, pid)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured time per level")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrencies")
    parser.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the report")
    parser.add_argument(
        "--transport",
        choices=("auto", "grpc", "http"),
        default="auto",
        help="the gateway's to Triton; auto: what it takes for a sidecar it supervises",
    )
    args = parser.parse_args(argv)
    levels = tuple(int(level) for level in args.levels.split(","))
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    tokenizer_dir = ensure_tiny_model()
    proxy = None if args.no_litellm else litellm_proxy.ensure_venv()
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as scratch:
        workdir = Path(scratch)
        spec = bench_spec(tokenizer_dir)
        sidecar = sidecar_from_spec(spec, spec.sidecars[0], workdir)
        with sidecar:
            sidecar.wait_ready(300, first_start=True)
            bench = Bench(sidecar, args.seconds, levels)
            if args.transport == "auto":
                args.transport = "http" if sidecar.keeps_responses else "grpc"
            config = gateway_config(sidecar, tokenizer_dir, args.transport)
            url, gateway = serve_process(config, workdir, "gateway")
            try:
                gateway_rss = rss_mib(gateway.pid)
                asyncio.run(
                    run_all(bench, url, gateway.pid, sidecar, proxy, tokenizer_dir, workdir)
                )
                gateway_rss = max(gateway_rss, rss_mib(gateway.pid))
            finally:
                stop_process(gateway)
            litellm_rss = bench.litellm_rss
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "seconds_per_level": args.seconds,
        "tokens": TOKENS,
        "transport": args.transport,
        "gateway_rss_mib": round(gateway_rss, 1),
        "litellm_rss_mib": None if litellm_rss is None else round(litellm_rss, 1),
        "litellm_version": litellm_proxy.VERSION,
        "date": time.strftime("%Y-%m-%d"),
    }
    cells = [
        {**asdict(cell), "cpu_ms_per_request": cell.cpu_ms_per_request} for cell in bench.cells
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench-serving.json").write_text(
        json.dumps({"meta": meta, "cells": cells}, indent=1)
    )
    report = bench_report.markdown(meta, bench.cells)
    (args.out / "bench-serving.md").write_text(report)
    bench_report.plot(bench.cells, args.out / "bench-serving.png")
    print(report)
    return 0


async def run_all(
    bench: Bench,
    url: str,
    gateway_pid: int,
    sidecar: Sidecar,
    proxy: Path | None,
    tokenizer_dir: Path,
    workdir: Path,
) -> None:
    """Every target against the load-test pipeline, then the end-to-end row on the tiny model."""
    both = ("completions", "chat")
    await bench.direct("loadtest", "loadtest_ensemble")
    await bench.direct("loadtest", "loadtest_tensorrt_llm", tokenizer_dir)
    await bench.http("loadtest", "gateway", url, "loadtest", gateway_pid, both)
    await bench.http("loadtest", "gateway, engine entry", url, "loadtest-engine", gateway_pid, both)
    levels = bench.levels
    if proxy is not None:
        async with litellm_proxy.running(proxy, sidecar, tokenizer_dir, workdir, KEY) as (
            litellm_url,
            pid,
        ):
            await bench.http("loadtest", "LiteLLM", litellm_url, "loadtest", pid, both)
            bench.litellm_rss = rss_mib(pid)
            bench.levels = tuple(level for level in levels if level <= 8)
            await bench.http("tiny", "LiteLLM", litellm_url, "tiny", pid, ("completions",))
    bench.levels = tuple(level for level in levels if level <= 8)
    await bench.direct("tiny", "tiny_ensemble")
    await bench.direct("tiny", "tiny_tensorrt_llm", tokenizer_dir)
    await bench.http("tiny", "gateway", url, "tiny", gateway_pid, ("completions",))
    engine_entry = "gateway, engine entry"
    await bench.http("tiny", engine_entry, url, "tiny-engine", gateway_pid, ("completions",))


if __name__ == "__main__":
    sys.exit(main())
