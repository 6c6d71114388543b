"""End to end on a GPU: the engine inside a tritonserver sidecar, the gateway in front of it.

The recipe, for a machine with a CUDA build of torch and no network (the lent H100 is one):

1. Where pip works: ``python -m deploy.devtools.offline pack .devrun/bundle --python 3.12 --exclude
   <the target's pip freeze>`` and copy a tokenizer folder (``--tokenizer``) beside it.
2. On the GPU machine:
   ``python3 -m deploy.devtools.offline install .devrun/bundle --prefix /tmp/gw``,
   then ``/tmp/gw/env/bin/python -m tests.benchmarks.gpu --text-env /tmp/gw/text-env
   --tokenizer DIR --out results``.

It builds two random-weight Llama models on the machine (about 1.1B and 0.16B parameters, the
tokenizer's vocabulary), serves both from ONE tritonserver through ``triton-gateway serve`` with a
``sidecars:`` section (PyTorch engine on CUDA in bfloat16; the text models in the numpy < 2
environment), and streams completions of a fixed length at several concurrencies through the
gateway and directly to the sidecar's ``ensemble`` over gRPC. Then both models answer chat
requests at once. Figures go to ``<out>/gpu-<device>.{md,json,png}``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.benchmarks import engine_profile
from tests.benchmarks.cpu_sets import parse_cpus, pin_self, pin_serving, topology
from tests.benchmarks.gpu_clients import (
    DIRECT_EXTRAS,
    ENTRY_NAMES,
    PROMPT,
    both_models,
    direct_request,
    direct_stream,
    direct_targets,
    gateway_client,
    gateway_model,
    gateway_stream,
    gateway_targets,
    gateway_ways,
    schedule,
)
from tests.benchmarks.gpu_readings import (
    engine_steps,
    gpu_memory,
    machine,
    scrape,
    served_ttft,
    triton_counters,
)
from tests.benchmarks.gpu_report import (
    Level,
    bucket_quantile,
    render_markdown,
    render_plot,
    summarise,
)
from tests.benchmarks.gpu_setup import (
    BIG,
    SMALL,
    TOY,
    build_model,
    ephemeral_port,
    gateway_config,
)
from tests.support.gateway import serve_process, stop_process

PROFILE_DELAY_S = 4.0
STATS_PERIOD_S = 0.5


async def run_level(
    target: str,
    url: str,
    grpc_url: str,
    model: str,
    gateway_names: dict[str, str],
    args: argparse.Namespace,
    concurrency: int,
    rounds: int,
    timeline: Path | None = None,
) -> Level:
    """``concurrency`` clients, each sending ``rounds`` requests back to back (each after a
    random wait of up to ``--spread-ms`` for a ``spread`` target). With ``timeline``, every
    request's send time, first token and end (seconds from the level's start) and what Triton's
    models counted during the level go to that file."""
    import tritonclient.grpc.aio as grpcclient

    results: list[dict[str, Any]] = []
    grpc_client = grpcclient.InferenceServerClient(grpc_url)
    extras = tuple(target.split("-")[1:])
    request = direct_request(model, args.tokens, extras, args.release)
    spread_s = args.spread_ms / 1000 if "spread" in extras else 0.0
    metrics_url = f"http://127.0.0.1:{args.metrics_port}/metrics"
    async with httpx.AsyncClient(timeout=60) as http:

        async def worker() -> None:
            client = gateway_client(url, gateway_names.get(target, ""), args.tokens)
            for _ in range(rounds):
                if spread_s:
                    await asyncio.sleep(random.uniform(0.0, spread_s))
                sent = time.perf_counter() - start
                if target.startswith("gateway"):
                    result = await gateway_stream(client)
                else:
                    result = await direct_stream(grpc_client._client_stub, request)
                results.append({**result, "sent": sent})

        before = await scrape(http, metrics_url)
        served = gateway_names.get(target, "")
        gateway_metrics = f"{url}/metrics"
        served_before = served_ttft(await scrape(http, gateway_metrics), served) if served else {}
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        # The engine publishes its counter every stats period: wait a period past the last token.
        await asyncio.sleep(STATS_PERIOD_S)
        after = await scrape(http, metrics_url)
        steps = engine_steps(after, model) - engine_steps(before, model)
        if served:
            served_after = served_ttft(await scrape(http, gateway_metrics), served)
            delta = {le: n - served_before.get(le, 0.0) for le, n in served_after.items()}
            served_p99 = bucket_quantile(delta, 0.99)
        if timeline is not None:
            requests = [
                [r["sent"], r["arrivals"][0] if r["arrivals"] else None, r["end"]] for r in results
            ]
            counted, counts = triton_counters(before), triton_counters(after)
            triton = {key: counts[key] - counted.get(key, 0.0) for key in counts}
            record = {"requests": requests, "triton": triton}
            timeline.write_text(json.dumps(record))
    await grpc_client.close()
    level = summarise(target, concurrency, results, wall, args.tokens, client_cores=cpu / wall)
    if served:
        level = dataclasses.replace(level, served_ttft_p99_s=served_p99)
    return level.with_steps(steps)


async def measure(
    args: argparse.Namespace, url: str, grpc_url: str, names: list[str]
) -> dict[str, Any]:
    main_model = names[0]
    ways = gateway_ways(args.transport, args.entry)
    targets = direct_targets(args.direct) + gateway_targets(ways)
    gateway_names = {
        target: gateway_model(main_model, way, ways)
        for target, way in zip(gateway_targets(ways), ways, strict=True)
    }
    warm = argparse.Namespace(**{**vars(args), "tokens": 16})
    for target in targets:
        await run_level(target, url, grpc_url, main_model, gateway_names, warm, 4, 1)
    levels: list[Level] = []
    profiles: dict[str, dict[str, float]] = {}
    for concurrency in args.concurrency:
        rounds = args.rounds or max(1, args.requests // concurrency)
        for group in schedule(targets, args.repeats, args.side_by_side):
            # A group of two shares the level's streams, so the engine serves as many as alone.
            streams = concurrency // len(group)
            runs = []
            for target, repeat in group:
                timeline = None
                if args.timelines:
                    timeline = args.out / f"timeline-{target}-c{concurrency}-r{repeat}.json"
                runs.append(run_level(
                    target, url, grpc_url, main_model, gateway_names, args, streams, rounds,
                    timeline,
                ))  # fmt: skip
            (target, repeat), *_ = group
            if args.py_spy is not None and repeat == 0 and len(group) == 1:
                folded = args.out / f"engine-{target}-c{concurrency}.folded"
                record = engine_profile.record(
                    args.py_spy, main_model, folded, PROFILE_DELAY_S, args.profile_seconds
                )
                done = await asyncio.gather(*runs, record)
                shares = profiles[f"{target} c={concurrency}"] = engine_profile.split(folded)
                print(f"engine thread, {target}: {shares}")
            else:
                done = await asyncio.gather(*runs)
            for level, (_, repeat) in zip(done, group, strict=False):
                level = dataclasses.replace(level, repeat=repeat, concurrency=concurrency)
                print(level.line(), flush=True)
                levels.append(level)
    together = await both_models(url, names, args.multi_streams, args.tokens)
    print("both models at once:", together, flush=True)
    return {"levels": levels, "multi_model": together, "engine_profiles": profiles}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--text-env", default=None, help="the numpy < 2 environment (text models)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--toy", action="store_true", help="tiny shapes, for a CPU dry run")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--requests",
        type=int,
        default=4,
        help="requests per level: every client sends requests/concurrency, >= 1",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="requests every client sends back to back at every level (instead of --requests)",
    )
    parser.add_argument(
        "--release",
        default="latest",
        help="the TensorRT-LLM release whose model configs are rendered; before 'latest' the "
        "ensemble reports no token counts and the gateway counts output tokens by log probs",
    )
    parser.add_argument(
        "--transport",
        choices=("http", "grpc"),
        nargs="+",
        default=["http"],
        help="the gateway's transports to Triton, each measured interleaved with the others: "
        "HTTP generate_stream (its default) and gRPC",
    )
    parser.add_argument(
        "--entry",
        choices=tuple(ENTRY_NAMES),
        nargs="+",
        default=["ensemble"],
        help="the pipeline models the gateway calls, each measured interleaved with the others: "
        "the `ensemble` (as the direct client does) or `tensorrt_llm` itself, the gateway "
        "tokenizing and detokenizing",
    )
    parser.add_argument(
        "--direct",
        nargs="*",
        default=[],
        metavar="EXTRAS",
        help="more direct targets, measured beside the plain one, each adding what the gateway "
        f"sends beyond the text: {', '.join(DIRECT_EXTRAS)} or both joined by '-'",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=4,
        help="gateway worker processes: with one, a burst of 128 requests waits on one "
        "process to start them all (about 3 ms each)",
    )
    parser.add_argument(
        "--triton-keep-alive-s",
        type=float,
        default=30.0,
        help="the gateway's limits.triton_keep_alive_s: how long its HTTP connections to Triton "
        "stay open idle for the next request (0: one per request)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per level")
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="run every gateway target at the same time as direct, each with half of the "
        "level's streams: both get tokens from the same engine steps, so the engine's "
        "swings between runs cancel out. What the gateway's requests cost every row of a step "
        "does not show here; sequential runs measure that",
    )
    parser.add_argument("--max-batch-size", type=int, default=128, help="the engine's batch")
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        help="a py-spy binary: sample the engine's stub during every target's first run at "
        "every level, into <out>/engine-<target>-c<concurrency>.folded",
    )
    parser.add_argument("--profile-seconds", type=int, default=8)
    parser.add_argument(
        "--timelines",
        action="store_true",
        help="write every run's requests (sent, first token, end) and Triton's per-model "
        "counters to <out>/timeline-<target>-c<concurrency>-r<repeat>.json",
    )
    parser.add_argument(
        "--spread-ms",
        type=float,
        default=50.0,
        help="a `spread` direct target waits a random 0 to this many ms before every request",
    )
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--guided", action="store_true", help="engine with xgrammar (installed)")
    parser.add_argument(
        "--mixed-batching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prompt chunks in the decode step's pass (the engine's default), or a pass each",
    )
    parser.add_argument(
        "--cpus",
        nargs="+",
        metavar="ROLE=CPUS",
        default=[],
        help="CPU sets, as `capacity --cpus`: triton=LIST (tritonserver and its stubs), "
        "gateway=LIST (the gateway's other processes), load=LIST (this benchmark's clients)",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    parser.add_argument("--multi-streams", type=int, default=16)
    args = parser.parse_args(argv)
    for variant in args.direct:
        parts = set(variant.split("-"))
        if not parts <= set(DIRECT_EXTRAS):
            parser.error(f"--direct {variant}: each part is one of {', '.join(DIRECT_EXTRAS)}")
        if "prompt" in parts and "counts" not in parts:
            parser.error(f"--direct {variant}: 'prompt' goes with 'counts' (counts-prompt)")
    try:
        sets = parse_cpus(args.cpus)
    except ValueError as exc:
        parser.error(f"--cpus: {exc}")
    args.metrics_port = ephemeral_port()
    workdir = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    args.out.mkdir(parents=True, exist_ok=True)
    shapes = {"llama-1b": TOY if args.toy else BIG, "llama-160m": TOY if args.toy else SMALL}
    models: dict[str, Path] = {}
    params: dict[str, int] = {}
    started = time.perf_counter()
    for name, shape in shapes.items():
        models[name] = workdir / name
        params[name] = build_model(models[name], args.tokenizer, shape, args.device)
    print(f"models built in {time.perf_counter() - started:.1f} s: {params}", flush=True)
    grpc_port = ephemeral_port()
    started = time.perf_counter()
    config = gateway_config(models, args, grpc_port)
    # The gateway's log lands in --out beside the results, started or not.
    url, process = serve_process(config, args.out, "gateway", timeout_s=args.start_timeout)
    ready_s = time.perf_counter() - started
    if sets:
        pinned = pin_serving(process.pid, sets)
        if "load" in sets:
            pin_self(sets["load"])
        print(f"threads pinned by role: {pinned}", flush=True)
    memory = {"ready": gpu_memory()}
    print(f"gateway and sidecar ready in {ready_s:.1f} s; GPU memory {memory['ready']}", flush=True)
    try:
        figures = asyncio.run(measure(args, url, f"127.0.0.1:{grpc_port}", list(models)))
        memory["after_load"] = gpu_memory()
    finally:
        stop_process(process)
    report = {
        "machine": machine(),
        "device": args.device,
        "transport": args.transport,
        "entry": args.entry,
        "targets": direct_targets(args.direct)
        + gateway_targets(gateway_ways(args.transport, args.entry)),
        "release": args.release,
        "gateway_workers": args.workers,
        "triton_keep_alive_s": args.triton_keep_alive_s,
        "mixed_batching": args.mixed_batching,
        "side_by_side": args.side_by_side,
        "order": "turned",
        "cpus": args.cpus,
        "cpu_siblings": topology() if args.cpus else None,
        "parameters": params,
        "ready_s": ready_s,
        "tokens": args.tokens,
        "prompt_chars": len(PROMPT),
        "gpu_memory_used": memory,
        **figures,
    }
    stem = args.out / (
        "gpu-" + re.sub(r"[^a-z0-9]+", "-", report["machine"].get("gpu", "cpu").lower())
    )
    Path(f"{stem}.json").write_text(json.dumps(report, default=lambda o: o.__dict__, indent=1))
    Path(f"{stem}.md").write_text(render_markdown(report))
    render_plot(report, Path(f"{stem}.png"))
    print(Path(f"{stem}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
