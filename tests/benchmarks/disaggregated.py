"""Disaggregated against aggregated serving on the same two sidecars and engine: long prompts
arriving at a steady rate beside running streams of a fixed length.

One gateway supervises two tritonserver sidecars (``a`` and ``b``), each running the same
engine, and serves two models over them: ``aggregated`` spreads every request over both as
whole replicas; ``disaggregated`` runs the context phase of long prompts on ``a`` and their
generation phase on ``b`` (short ones run whole on ``b``), as a deploy spec with a context and
a generation sidecar does. Each setup in turn gets ``--streams`` streams of ``--stream-tokens``
tokens (each sent again as soon as it ends) and, after ``--warmup`` seconds, prompts of
``--long-prompt-tokens`` tokens at ``--long-rate`` per second for ``--seconds``. Printed side by
side: the running streams' inter-token latency (ITL) p50/p99, the long requests' time to first
token (TTFT) and to their second token p50/p99, and the handoffs' mean time from the
generation engine's ``nv_trt_llm_disaggregated_serving_metrics`` (``kv_cache_transfer_ms`` over
``request_count``) with its share of the median TTFT. A split request's first token comes from
the context phase before the handoff, so the handoff shows in the second token's time.

    # CPU smoke, the tiny model (about a minute and a half):
    python -m tests.benchmarks.disaggregated --device cpu --streams 2 --stream-tokens 32 \\
        --long-prompt-tokens 512 --long-rate 0.5 --long-tokens 8 --seconds 20 --warmup 3
    # a GPU host, from the offline bundle (docs/deployment/gpu-offline.md):
    /opt/gw/env/bin/python -m tests.benchmarks.disaggregated --text-env /opt/gw/text-env \\
        --gpus 2 --out results

The model is by default the random-weight Llama of about 1.1B parameters that
``tests.benchmarks.gpu`` builds (``--model llama-160m`` for its small one, ``tiny`` for the
tiny test model, the default on the CPU, or a folder), with the tokenizer of ``--tokenizer``
(default: the tiny model's). ``--gpus 1`` puts both sidecars on GPU 0, each with a KV cache of
the same fixed size (said in the header).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.benchmarks.disaggregated_load import SetupFigures, prompt_of, run_setup
from tests.benchmarks.gpu_readings import machine
from tests.benchmarks.gpu_setup import BIG, SMALL, build_model, ephemeral_port
from tests.support.gateway import serve_process, stop_process

PIPELINE = "llm"
ENGINE = f"{PIPELINE}_tensorrt_llm"
SETUPS = {"aggregated": "llm-aggregated", "disaggregated": "llm-disaggregated"}
SHAPES = {"llama-1b": BIG, "llama-160m": SMALL}


def model_folder(args: argparse.Namespace, workdir: Path) -> tuple[Path, str]:
    """The model's folder and how the header names it (built here for the random Llamas)."""
    from deploy.sidecar.models import ensure_tiny_model

    name = args.model if args.model != "auto" else ("tiny" if args.device == "cpu" else "llama-1b")
    if name == "tiny":
        return ensure_tiny_model(), "the tiny test model"
    if name in SHAPES:
        tokenizer = args.tokenizer or ensure_tiny_model()
        params = build_model(workdir / name, tokenizer, SHAPES[name], args.device)
        if args.device == "cuda":
            import torch

            # What building took stays reserved by this process on GPU 0 otherwise.
            torch.cuda.empty_cache()
        return workdir / name, f"{name}, random weights, {params / 1e9:.2f}B parameters"
    return Path(name), name


def kv_bytes_per_token(folder: Path, device: str) -> int:
    """Bytes of KV cache one token takes (keys and values of every layer)."""
    config = json.loads((folder / "config.json").read_text())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    width = 2 if device == "cuda" else 4  # bfloat16 on CUDA, float32 on the CPU
    return int(2 * config["num_hidden_layers"] * kv_heads * head_dim * width)


def placement(args: argparse.Namespace) -> list[dict[str, str]]:
    """Each sidecar's environment: its GPU."""
    if args.device == "cpu":
        return [{}, {}]
    return [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "0" if args.gpus == 1 else "1"}]


def gateway_config(
    args: argparse.Namespace, folder: Path, ports: list[tuple[int, int]]
) -> dict[str, Any]:
    """Two sidecars of the same engine, and the two ways to serve the model over them."""
    engine = {
        "kind": "torch",
        "model_dir": str(folder),
        "device": args.device,
        "dtype": "bfloat16" if args.device == "cuda" else "float32",
        "max_batch_size": args.max_batch_size,
        "max_seq_len": args.max_seq_len,
        "guided_decoding": False,
        "max_tokens_in_paged_kv_cache": args.kv_tokens,
        "kv_transfer_timeout_ms": 60000,
    }
    if args.device == "cuda" and args.gpus == 1:
        # The first sidecar to load must leave room for the other's model and cache.
        engine["kv_cache_free_gpu_mem_fraction"] = 0.45
    only_engine = ["--model-control-mode=explicit", f"--load-model={ENGINE}"]
    sidecars = [
        {"name": name, "grpc_port": grpc, "metrics_port": metrics, "env": env,
         "extra_args": only_engine, "keep_responses": False}
        for name, (grpc, metrics), env in zip("ab", ports, placement(args), strict=True)
    ]  # fmt: skip
    endpoints = [
        {"name": name, "url": f"127.0.0.1:{grpc}",
         "metrics_url": f"http://127.0.0.1:{metrics}/metrics"}
        for name, (grpc, metrics) in zip("ab", ports, strict=True)
    ]  # fmt: skip
    split = {
        "context_replicas": [endpoints[0]],
        # Between the two lengths: the streams run whole on the generation sidecar.
        "min_prompt_tokens": (args.stream_prompt_tokens + args.long_prompt_tokens) // 2,
    }
    return {
        "models": [
            {
                "name": SETUPS["aggregated"],
                "pipeline": PIPELINE,
                "entry": "tensorrt_llm",
                "routing": {"policy": "least_request"},
            },
            {
                "name": SETUPS["disaggregated"],
                "entry": "tensorrt_llm",
                "triton_model": ENGINE,
                "tokenizer_dir": str(folder),
                "replicas": [endpoints[1]],
                "routing": {"policy": "least_request", "disaggregation": split},
            },
        ],
        "sidecars": {
            "inline": {
                "models": [
                    {
                        "name": PIPELINE,
                        "release": "latest",
                        "engine": engine,
                        "text_python_env": args.text_env,
                    }
                ],
                "sidecars": sidecars,
            }
        },
        "server": {"workers": args.workers},
        "tenancy": {"auth": False},
        "limits": {"request_timeout_s": 300},
    }


async def warm_up(url: str, tokenizer: Any, args: argparse.Namespace) -> None:
    """A long and a short request of each setup, twice at once, before anything is timed: the
    engines' first passes of each shape are slow."""
    import random

    import httpx

    rng = random.Random(args.seed)
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        for model in SETUPS.values():
            bodies = [
                {"model": model, "prompt": prompt_of(tokenizer, rng, tokens), "max_tokens": 4}
                for tokens in (args.long_prompt_tokens, args.stream_prompt_tokens)
                for _ in range(2)
            ]
            for answer in await asyncio.gather(
                *(http.post("/v1/completions", json=body) for body in bodies)
            ):
                answer.raise_for_status()


def header(args: argparse.Namespace, described: str, kv_gib: float) -> list[str]:
    """What ran, for the top of the report."""
    if args.device == "cpu":
        where = "the CPU (both sidecars on the host's cores)"
    elif args.gpus == 2:
        where = "CUDA: sidecar a on GPU 0, sidecar b on GPU 1"
    else:
        where = (
            "CUDA, ONE GPU split by memory: sidecars a and b both on GPU 0, each with a KV "
            "cache of at most the tokens below and 45% of the memory free when it loads"
        )
    return [
        f"- device: {where}",
        f"- model: {described}; engine batch {args.max_batch_size}, max_seq_len {args.max_seq_len}",
        f"- KV cache per sidecar: {args.kv_tokens} tokens ({kv_gib:.2f} GiB)",
        f"- running streams: {args.streams} x {args.stream_tokens} tokens (prompts of "
        f"{args.stream_prompt_tokens} tokens), each sent again as soon as it ends",
        f"- long prompts: {args.long_prompt_tokens} tokens at {args.long_rate}/s for "
        f"{args.seconds} s after {args.warmup} s of streams alone, {args.long_tokens} tokens "
        "each",
        "- aggregated: both sidecars whole replicas (least request); disaggregated: context "
        "phase on a, generation phase on b, prompts under "
        f"{(args.stream_prompt_tokens + args.long_prompt_tokens) // 2} tokens whole on b",
    ]


def _pair(values: tuple[float, float]) -> str:
    return f"{values[0]:.1f} / {values[1]:.1f}"


def table(figures: list[SetupFigures]) -> list[str]:
    """The setups side by side."""
    lines = [
        "| setup | streams ITL p50 / p99 ms | long TTFT p50 / p99 ms | long 2nd token p50 / p99 "
        "ms | stream tokens/s | long done (errors) | handoffs | handoff ms | handoff / TTFT p50 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        share = f"{f.handoff_share:.1%}" if f.handoffs else "-"
        handoff = f"{f.handoff_ms:.1f}" if f.handoffs else "-"
        lines.append(
            f"| {f.setup} | {_pair(f.itl_ms)} | {_pair(f.ttft_ms)} | {_pair(f.second_token_ms)} "
            f"| {f.stream_tokens_s:.0f} | {f.long_done} ({f.long_errors}) | {f.handoffs:.0f} "
            f"| {handoff} | {share} |"
        )
    errors = [f"- {f.setup}: first error {f.first_error}" for f in figures if f.first_error]
    return lines + errors


async def measure(url: str, metrics_b: str, tokenizer: Any, args: argparse.Namespace) -> list[Any]:
    await warm_up(url, tokenizer, args)
    figures = []
    for setup, model in SETUPS.items():
        figures.append(await run_setup(setup, url, model, metrics_b, tokenizer, args))
        print(table(figures)[-1], flush=True)
    return figures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--device", choices=("cuda", "cpu"), default="cuda")
    add("--gpus", type=int, choices=(1, 2), default=2, help="1: both sidecars on GPU 0")
    add("--model", default="auto", help="llama-1b, llama-160m, tiny or a folder")
    add("--tokenizer", type=Path, default=None, help="for the random Llamas (default: tiny's)")
    add("--text-env", default=None, help="the numpy < 2 environment of the offline bundle")
    add("--streams", type=int, default=32, help="running streams")
    add("--stream-tokens", type=int, default=128, help="tokens of each running stream")
    add("--stream-prompt-tokens", type=int, default=64)
    add("--long-prompt-tokens", type=int, default=4000)
    add("--long-rate", type=float, default=1.0, help="long prompts per second")
    add("--long-tokens", type=int, default=16, help="tokens each long request generates")
    add("--seconds", type=float, default=60.0, help="how long long prompts arrive, per setup")
    add("--warmup", type=float, default=5.0, help="seconds of streams alone, per setup")
    add("--max-batch-size", type=int, default=64)
    add("--kv-tokens", type=int, default=None, help="KV cache per sidecar, in tokens")
    add("--workers", type=int, default=2, help="gateway worker processes")
    add("--seed", type=int, default=0)
    add("--start-timeout", type=float, default=300.0)
    add("--out", type=Path, default=None, help="write disaggregated-<device>.{md,json} here")
    args = parser.parse_args(argv)
    longest = max(args.long_prompt_tokens + args.long_tokens,
                  args.stream_prompt_tokens + args.stream_tokens)  # fmt: skip
    args.max_seq_len = longest + 64
    args.kv_tokens = args.kv_tokens or args.max_batch_size * args.max_seq_len
    return args


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-disagg-"))
    out = args.out or workdir
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    folder, described = model_folder(args, workdir)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    kv_gib = args.kv_tokens * kv_bytes_per_token(folder, args.device) / 2**30
    lines = ["# Disaggregated against aggregated serving", "", *header(args, described, kv_gib)]
    lines.append(f"- host: {json.dumps(machine())}")
    print("\n".join(lines), flush=True)
    ports = [(ephemeral_port(), ephemeral_port()) for _ in range(2)]
    config = gateway_config(args, folder, ports)
    url, process = serve_process(config, out, "gateway", timeout_s=args.start_timeout)
    print(f"- ready in {time.perf_counter() - started:.0f} s (model and both sidecars)", flush=True)
    try:
        metrics_b = f"http://127.0.0.1:{ports[1][1]}/metrics"
        figures = asyncio.run(measure(url, metrics_b, tokenizer, args))
    finally:
        stop_process(process)
    lines += ["", *table(figures), "", f"Whole run: {time.perf_counter() - started:.0f} s."]
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    stem = out / f"disaggregated-{args.device}"
    Path(f"{stem}.md").write_text(report)
    record = {"args": {k: str(v) for k, v in vars(args).items()},
              "figures": [f.__dict__ for f in figures]}  # fmt: skip
    Path(f"{stem}.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
