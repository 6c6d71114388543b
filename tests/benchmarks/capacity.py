"""Capacity: how many streamed tokens per second the gateway passes on, against direct Triton.

One tritonserver serves the PACED load-test engine (``engine: {kind: loadtest, token_s}``) as
the ``tensorrt_llm`` model: every stream gets a token each ``1/--rate`` seconds, the way a
TensorRT-LLM engine on a GPU streams, while the host spends almost nothing on it. The same
closed-loop load then rises from one stream to thousands against:

- ``direct``: Triton's HTTP ``generate_stream`` to the engine, the prompt's ids prebuilt;
- ``direct-grpc`` (``--direct-grpc``): the same request on Triton's gRPC ``ModelStreamInfer``,
  through the backend's own HTTP/2 client, one connection a load process: Triton's gRPC
  frontend beside its HTTP one, which is what a gateway reaching Triton over gRPC starts from;
- ``gateway-1``: ``triton-gateway serve`` with one worker, ``/v1/completions`` streamed, the
  engine entry (the gateway tokenizes and detokenizes), auth and the rate limiter on;
- ``gateway-N``: the same with ``--workers`` worker processes (limits in the embedded Redis);
  it reaches Triton over gRPC, and ``gateway-N-http`` over Triton's HTTP ``generate_stream``
  (``--transports``);
- ``relay-N``: the floor of a Python hop (``tests/benchmarks/relay.py``): ``N`` uvicorn workers
  served as the gateway's are, relaying the direct request and Triton's events untouched, so the
  gateway's own cost is its distance from this row rather than from direct Triton;
- ``gateway-N@baseline``: with ``--baseline DIR``, the gateway of another checkout, so that a
  change is measured beside the code before it, on one host, in the same rounds.

The load comes from ``--clients`` processes, each an event loop of raw HTTP/1.1 clients. The
streams' first requests are spread over one request's paced length (``--arrivals staggered``),
as requests of varied lengths arrive; ``--arrivals burst`` starts them all at once, and with
equal lengths they then arrive together after every request. Per level: tokens/s (the tokens
that arrived in the ``--seconds`` while every stream was sending), time to first token and
inter-token latency p50/p99 (without the staggered first requests), errors (an answer short of
its ``--tokens`` among them: the paced engine sends them all), and the CPU of
each process tree (Triton, the gateway, the load generator itself, whose ceiling shows in its
own row). Every target runs from the start and each level measures them one after the other,
direct first; ``--rounds`` repeats the whole for a median and range per row, each round against
direct Triton's rows of that round. Chat completions run at a few levels too, against direct
Triton given the ids of the templated conversation the gateway sends (longer than the bare
prompt, so the engine's paced prompt time is longer too). Markdown, JSON and a plot go to ``--out``.

Run on the GPU host from the offline bundle (``make capacity``); it needs no GPU, only cores.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deploy.sidecar.models import ensure_tiny_model
from gateway.catalog.text.hub import load_tokenizer
from tests.benchmarks.capacity_load import Row, measure
from tests.benchmarks.capacity_report import render_markdown, render_plot, report_of
from tests.benchmarks.capacity_setup import (
    ENGINE_MODEL,
    PROMPT,
    chat_ids,
    direct_grpc_job,
    gateway_config,
    start_triton,
)
from tests.benchmarks.cpu_sets import parse_cpus, pin_self, pin_tree
from tests.benchmarks.relay import relay_process
from tests.support.gateway import serve_process, stop_process

LEVELS = (1, 8, 32, 64, 128, 192, 256, 320, 384, 512, 768, 1024, 1536)
CHAT_LEVELS = (64, 320, 1024)


@dataclass(frozen=True)
class Target:
    """What one row's target is sent: its URL, the text and chat jobs (a chat job of ``None``:
    the target serves no chats), and the process trees whose CPU it uses."""

    name: str
    url: str
    text: dict[str, Any]
    chat: dict[str, Any] | None
    trees: dict[str, int]


def place(targets: list[Target], sets: dict[str, frozenset[int]]) -> None:
    """Each target's process trees on their role's CPUs (a relay on the gateway's), and this
    process, whose load generator processes start from it, on the load's."""
    for target in targets:
        for role, pid in target.trees.items():
            if role in sets:
                pin_tree(pid, sets[role])
    if "load" in sets:
        pin_self(sets["load"])


def knows_transports(code: str) -> bool:
    """Whether the checkout at ``code`` has the ``transport`` setting of a model."""
    return "transport: Transport" in (Path(code) / "gateway" / "settings.py").read_text()


def knows_embedded_store(code: str) -> bool:
    """Whether the checkout at ``code`` names the embedded store ``embedded`` (before, ``memory``
    with several workers ran it)."""
    return '"embedded"' in (Path(code) / "gateway" / "tenancy" / "config.py").read_text()


def profiled(env: dict[str, str], folder: Path, code: str | None) -> dict[str, str]:
    """A gateway's environment with its workers profiled into ``folder``
    (``tests/benchmarks/profiling/sitecustomize.py``)."""
    folder.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]
    hook = str(root / "tests" / "benchmarks" / "profiling")
    return {**env, "PYTHONPATH": f"{hook}:{code or root}", "GATEWAY_PROFILE_DIR": str(folder)}


def measure_round(targets: list[Target], args: argparse.Namespace, round_: int) -> list[Row]:
    """Every level of every target: text at each level, then chats at theirs; within a level
    the targets one after the other."""
    rows = []
    for streams in args.levels:
        for target in targets:
            rows.append(measure(target.name, "text", target.url, target.text, streams, args,
                                target.trees, round_))  # fmt: skip
    for streams in (s for s in CHAT_LEVELS if s in args.levels):
        for target in targets:
            if target.chat is not None:
                rows.append(measure(target.name, "chat", target.url, target.chat, streams, args,
                                    target.trees, round_))  # fmt: skip
    return rows


def run(
    args: argparse.Namespace, written: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Every round of every target; ``written`` gets the report so far after each round, so a
    run cut short keeps the rounds it finished."""
    tokenizer = Path(args.tokenizer) if args.tokenizer else ensure_tiny_model()
    vocabulary = load_tokenizer(str(tokenizer))
    ids = vocabulary.encode(PROMPT, add_special_tokens=True)
    templated = chat_ids(vocabulary)
    word = vocabulary.encode(" the", add_special_tokens=False)[-1]
    workdir = Path(tempfile.mkdtemp(prefix="capacity-"))
    sidecar = start_triton(args, tokenizer, workdir, word)
    rows: list[Row] = []
    report = report_of(args, [], len(ids), len(templated), 0)
    direct = {"path": f"/v2/models/{ENGINE_MODEL}/generate_stream", "direct": True,
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
        with contextlib.ExitStack() as running:
            triton = {"triton": sidecar.pid or 0}
            # Every target runs from the start, so that each level measures them one after the
            # other (direct first), round after round: drift of the host falls on all alike.
            targets = [Target("direct", sidecar.http_url, direct, direct_chat, triton)]
            if args.direct_grpc:
                text_job = direct_grpc_job(list(ids), args.tokens)
                chat_job = direct_grpc_job(templated, args.tokens)
                targets.append(Target("direct-grpc", sidecar.grpc_url, text_job, chat_job, triton))
            for workers in args.relay if args.relay is not None else [max(args.workers)]:
                relayed = relay_process(sidecar, ENGINE_MODEL, direct["body"], workdir, workers)
                url, pid = running.enter_context(relayed)
                targets.append(Target(f"relay-{workers}", url, direct, None,
                                      {**triton, "gateway": pid}))  # fmt: skip
            variants = [(w, True) for w in args.workers]
            # One worker counts limits in its own memory, answered at once: nothing to wait for.
            variants += [(w, False) for w in args.workers if args.waiting_admission and w > 1]
            # A baseline checkout's gateway runs beside this tree's, with the same settings.
            trees = [("", None)] + ([("@baseline", str(args.baseline))] if args.baseline else [])
            for (workers, ahead), transport, (tree, code) in itertools.product(
                variants, args.transports, trees
            ):
                if code is not None and transport not in (args.baseline_transports or [transport]):
                    continue
                name = (f"gateway-{workers}" + ("" if ahead else "-waiting")
                        + ("-http" if transport == "http" else "") + tree)  # fmt: skip
                config = gateway_config(
                    sidecar, tokenizer, workers, send_ahead=ahead, transport=transport,
                    before_transports=code is not None and not knows_transports(code),
                    before_embedded=code is not None and not knows_embedded_store(code),
                )  # fmt: skip
                if code is None and args.max_in_flight is not None:
                    # This tree's models at a cap they never reach: every request takes a slot
                    # of the fair queue, uncontended.
                    config["models"][0]["routing"] = {"max_in_flight": args.max_in_flight}
                env = {"PYTHONPATH": code} if code else None
                if args.profile is not None:
                    env = profiled(env or {}, args.profile, code)
                url, process = serve_process(config, workdir, name, timeout_s=180, env=env)
                running.callback(stop_process, process)
                targets.append(Target(name, url, completion, chat,
                                      {**triton, "gateway": process.pid}))  # fmt: skip
            if args.cpus:
                place(targets, parse_cpus(args.cpus))
            for round_ in range(args.rounds):
                rows.extend(measure_round(targets, args, round_))
                report = report_of(
                    args, [asdict(row) for row in rows], len(ids), len(templated), round_ + 1
                )
                if written is not None:
                    written(report)
    finally:
        sidecar.stop()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(".bench/results"))
    parser.add_argument("--rate", type=float, default=80.0, help="tokens/s per stream")
    parser.add_argument("--prompt-token-s", type=float, default=0.00005)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--instances", type=int, default=8, help="engine instances")
    parser.add_argument(
        "--senders", type=int, default=4, help="threads of each engine instance sending responses"
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--relay",
        type=int,
        nargs="*",
        help="worker counts of the relay, the floor of a Python hop (tests/benchmarks/relay.py; "
        "default: the most gateway workers; none: no relay)",
    )
    parser.add_argument(
        "--waiting-admission",
        action="store_true",
        help="also every gateway of several workers (their embedded Redis counts the limits) "
        "with tenancy.store.send_ahead off (gateway-N-waiting): each request waits for its "
        "Redis admission before it goes to Triton",
    )
    parser.add_argument(
        "--transports",
        nargs="+",
        choices=("grpc", "http"),
        default=["grpc"],
        help="the gateway's transports to Triton, each a gateway of its own (gateway-N over gRPC, "
        "gateway-N-http over Triton's HTTP generate_stream)",
    )
    parser.add_argument(
        "--direct-grpc",
        action="store_true",
        help="also Triton's gRPC ModelStreamInfer, direct (direct-grpc): its frontend beside "
        "its HTTP one, under the same load",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of this project: each gateway also runs from its code "
        "(gateway-N@baseline), measured in the same rounds, a change's before beside its after",
    )
    parser.add_argument(
        "--baseline-transports",
        nargs="+",
        choices=("grpc", "http"),
        help="the transports the baseline's gateways use (default: all of --transports), when a "
        "change touches only one of them",
    )
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    parser.add_argument(
        "--max-in-flight",
        type=int,
        help="this tree's gateways cap the model at this many requests a worker (the fair "
        "queue in the path, uncontended when above the streams); the baseline's do not",
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every target at every level this many times, round after round; the "
        "report adds each row's median and range over the rounds",
    )
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument(
        "--stall-s",
        type=float,
        default=120.0,
        help="how long one request may take before it counts as an error (stalled) and its "
        "stream is closed",
    )
    parser.add_argument(
        "--think-ms",
        type=float,
        default=0.0,
        help="each stream's pause between an answer's end and its next request (default none)",
    )
    parser.add_argument("--clients", type=int, default=max(1, (os.cpu_count() or 2) // 4))
    parser.add_argument(
        "--arrivals",
        choices=("staggered", "burst"),
        default="staggered",
        help="staggered: the streams' first requests spread over one request's paced length, as "
        "requests of varied lengths arrive; burst: every stream starts at once, and with equal "
        "lengths they stay in step, all arriving together again after every request",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="a folder for a cProfile of every gateway worker "
        "(summed up by python -m tests.benchmarks.profiling DIR)",
    )
    parser.add_argument(
        "--cpus",
        nargs="+",
        metavar="ROLE=CPUS",
        help="CPU sets by role (triton, gateway, load), e.g. triton=0-8 gateway=9-13 load=14-15: "
        "each process tree on cores of its own, as in containers with CPU sets (default: every "
        "process may run on every core)",
    )
    parser.add_argument("--tokenizer", help="tokenizer folder (default: the tiny model's)")
    parser.add_argument("--text-env", help="text_python_env of the sidecar (numpy < 2)")
    args = parser.parse_args()
    stem = args.out / f"capacity-{os.cpu_count()}cpu"

    def write(report: dict[str, Any]) -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
        stem.with_suffix(".md").write_text(render_markdown(report))

    report = run(args, write)
    write(report)  # a run of no rounds has its report too
    render_plot(report, stem.with_suffix(".png"))
    print(render_markdown(report))


if __name__ == "__main__":
    main()
