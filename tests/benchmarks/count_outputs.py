"""What the token counts cost the engine's stub and Triton, without a GPU: CPU a response.

The gateway asks the ensemble for ``num_output_tokens`` with every request (its ``usage``),
and for ``num_input_tokens`` too where it cannot count the prompt itself (images); on the GPU
host a direct client asking for both lost about a millisecond of every 128-row decode step
(``tests.benchmarks.gpu --direct counts-prompt``). This serves the zero-compute load-test engine
(one instance, one sender thread, no pacing), so the stub's sending is the limit, and streams
straight to its ``tensorrt_llm`` over Triton's HTTP ``generate_stream`` without the count flags,
with the output count's, with both, and with the output count's and the perf metrics', in turn,
round after round. It
prints each round's tokens/s and the CPU a response took in the engine's stub and in
tritonserver itself (its own threads, not its children), then their medians over the rounds.
On a machine of few cores the tokens/s swing from round to round with the load generator's own
share of the cores; the CPU a response does much less.
``python -m tests.benchmarks.count_outputs [--streams 8 --rounds 8 --seconds 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from deploy.sidecar.models import ensure_tiny_model
from deploy.sidecar.supervisor import Sidecar
from gateway.catalog.text.hub import load_tokenizer
from tests.benchmarks.capacity_setup import ENGINE_MODEL, PROMPT, start_triton
from tests.benchmarks.gpu_clients import turn
from tests.benchmarks.loadgen import HttpClient, has_output_ids, run_level

OUTPUT_COUNT = {"return_num_output_tokens": [True]}
COUNTS = {"return_num_input_tokens": [True], **OUTPUT_COUNT}
PERF = {"return_perf_metrics": [True], **OUTPUT_COUNT}
BODIES = {"without": {}, "output": OUTPUT_COUNT, "both": COUNTS, "perf": PERF}
"""The flags of each body: no count, the output count (the gateway's text prompts), both, and
the output count with the perf metrics (ten more tensors on a request's first and last
responses: the gateway asks for them for its cached tokens where the engine's block size is
known)."""


@dataclass(frozen=True)
class Level:
    """One round of one body: tokens/s and CPU microseconds a response, by process."""

    tokens_per_s: float
    stub_us: float
    server_us: float


def summary(without: list[Level], with_counts: list[Level]) -> dict[str, float]:
    """The rounds without and with the counts: the median share of each round's pair in tokens/s,
    and the CPU a response each process spent, medians over the rounds."""
    shares = [
        100 * c.tokens_per_s / p.tokens_per_s for p, c in zip(without, with_counts, strict=True)
    ]
    return {
        "share_pct": statistics.median(shares),
        "stub_us": statistics.median(level.stub_us for level in without),
        "stub_counts_us": statistics.median(level.stub_us for level in with_counts),
        "server_us": statistics.median(level.server_us for level in without),
        "server_counts_us": statistics.median(level.server_us for level in with_counts),
    }


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _level(
    url: str, body: dict[str, Any], streams: int, seconds: float, stub: psutil.Process,
    server: psutil.Process,
) -> Level:  # fmt: skip
    host, _, port = url.removeprefix("http://").rpartition(":")

    async def connect() -> Any:
        path = f"/v2/models/{ENGINE_MODEL}/generate_stream"
        client = HttpClient(
            host, int(port), path, body, "", is_token=has_output_ids, ends_with_done=False
        )
        return client.send

    before = _cpu_s(stub), _cpu_s(server)
    samples, wall = asyncio.run(run_level(connect, streams, seconds))
    spent = _cpu_s(stub) - before[0], _cpu_s(server) - before[1]
    failed = [s.error for s in samples if s.error]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, the first: {failed[0]}")
    responses = sum(s.tokens for s in samples)
    return Level(responses / wall, 1e6 * spent[0] / responses, 1e6 * spent[1] / responses)


def _stub(server: psutil.Process) -> psutil.Process:
    """The stub of the engine's model instance."""
    for child in server.children(recursive=True):
        if f"/{ENGINE_MODEL}/" in " ".join(child.cmdline()):
            return child
    raise RuntimeError(f"no stub serves {ENGINE_MODEL}")


def _rounds(args: argparse.Namespace, sidecar: Sidecar, ids: list[int]) -> dict[str, list[Level]]:
    """Every round of every body of ``BODIES``, in an order that turns every round."""
    plain = {"input_ids": list(ids), "input_lengths": [len(ids)],
             "request_output_len": [args.tokens], "streaming": [True]}  # fmt: skip
    bodies = {name: plain | flags for name, flags in BODIES.items()}
    levels: dict[str, list[Level]] = {name: [] for name in bodies}
    try:
        server = psutil.Process(sidecar.pid)
        stub = _stub(server)
        _level(sidecar.http_url, plain, args.streams, 1.0, stub, server)  # warm-up
        for round_ in range(args.rounds):
            # The order turns every round, so a drift of the host falls on every body alike.
            for name in turn(list(bodies), round_):
                level = _level(sidecar.http_url, bodies[name], args.streams, args.seconds, stub,
                               server)  # fmt: skip
                levels[name].append(level)
                print(
                    f"round {round_} {name:7s}: {level.tokens_per_s:9,.0f} tokens/s, "
                    f"a response {level.stub_us:.1f} µs CPU in the stub, "
                    f"{level.server_us:.1f} µs in tritonserver",
                    flush=True,
                )
    finally:
        sidecar.stop()
    return levels


_TITLES = {"output": "output count", "both": "counts", "perf": "output count and perf metrics"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    tokenizer = ensure_tiny_model()
    vocabulary = load_tokenizer(str(tokenizer))
    ids = vocabulary.encode(PROMPT, add_special_tokens=True)
    word = vocabulary.encode(" the", add_special_tokens=False)[-1]
    engine = argparse.Namespace(rate=1e9, prompt_token_s=0.0, instances=1, senders=1, text_env=None)
    with tempfile.TemporaryDirectory(prefix="counts-") as workdir:
        levels = _rounds(args, start_triton(engine, tokenizer, Path(workdir), word), ids)
    print(f"{args.streams} streams of {args.tokens} tokens, {args.rounds} rounds of "
          f"{args.seconds:g} s, medians:")  # fmt: skip
    for name in ("output", "both", "perf"):
        found = summary(levels["without"], levels[name])
        print(
            f"- {_TITLES[name]}: CPU a response in the stub "
            f"{found['stub_us']:.1f} µs without, {found['stub_counts_us']:.1f} with; in "
            f"tritonserver {found['server_us']:.1f} and {found['server_counts_us']:.1f}; tokens/s "
            f"{found['share_pct']:.1f}% of without (the rounds' pairs)"
        )


if __name__ == "__main__":
    main()
