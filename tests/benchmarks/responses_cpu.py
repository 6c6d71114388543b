"""``make bench``: a streamed ``/v1/responses`` answer's CPU per token beside the same streamed
chat completion's, in one run.

A response runs as a chat completion whose chunks become the response's events, so the question
is what that translation adds. As ``gateway_cpu``, the gateway app is driven in this process and
Triton's answers to the same request (the zero-compute load-test engine's) are replayed, so the
figures are the code this project owns, not the machine's neighbours. Each endpoint is measured
whole and streamed; the cost of a streamed token is the difference over the tokens. The
responses are stored (the default, in the memory store), as a client's would be.

Prints the table and the ratio of the per-token costs (the goal: at most 1.10).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from adapters.triton.replay import ReplayingTritonBackend
from gateway.app import create_app
from gateway.observability.logs import configure_logging
from gateway.settings import parse_settings
from tests.benchmarks.gateway_cpu import InProcessClient, loadtest_sidecar
from tests.benchmarks.serving import PROMPT, gateway_config

MODEL = "loadtest"
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


def body(endpoint: str, stream: bool, tokens: int) -> dict[str, Any]:
    """The same question to both endpoints, ``tokens`` tokens long."""
    if endpoint == "chat":
        asked: dict[str, Any] = {"messages": [{"role": "user", "content": PROMPT}]}
        asked["max_completion_tokens"] = tokens
        if stream:
            asked["stream_options"] = {"include_usage": True}
    else:
        asked = {"input": PROMPT, "max_output_tokens": tokens}
    return {"model": MODEL, "stream": stream, **asked}


async def measure(
    client: InProcessClient, requests: int, tokens: int, rounds: int
) -> dict[tuple[str, bool], float]:
    """CPU µs per request of each endpoint whole and streamed, the quietest of ``rounds``,
    the endpoints' rounds interleaved so that both see the same machine."""
    figures: dict[tuple[str, bool], list[float]] = {}
    cases = [(endpoint, stream) for endpoint in PATHS for stream in (False, True)]
    for endpoint, stream in cases:
        for _ in range(50):
            await client.post(PATHS[endpoint], body(endpoint, stream, tokens))
    for _ in range(rounds):
        for endpoint, stream in cases:
            asked = body(endpoint, stream, tokens)
            start = time.process_time()
            for _ in range(requests // rounds):
                await client.post(PATHS[endpoint], asked)
            spent = 1e6 * (time.process_time() - start) / (requests // rounds)
            figures.setdefault((endpoint, stream), []).append(spent)
    return {case: min(taken) for case, taken in figures.items()}


def report(figures: dict[tuple[str, bool], float], requests: int, tokens: int) -> str:
    """The Markdown table and the ratio of the per-token costs."""
    per_token = {
        endpoint: (figures[(endpoint, True)] - figures[(endpoint, False)]) / tokens
        for endpoint in PATHS
    }
    lines = [
        "# A streamed response's CPU beside the same streamed chat completion",
        "",
        f"{time.strftime('%Y-%m-%d')}; `python -m tests.benchmarks.responses_cpu`; {requests} "
        f"requests per case, {tokens} tokens each, Triton's answers replayed (see the module).",
        "",
        "| endpoint | CPU per request, whole | CPU per request, streamed "
        "| CPU per streamed token |",
        "|---|---|---|---|",
    ]
    for endpoint in PATHS:
        lines.append(
            f"| {PATHS[endpoint]} | {figures[(endpoint, False)]:,.0f} µs "
            f"| {figures[(endpoint, True)]:,.0f} µs | {per_token[endpoint]:,.1f} µs |"
        )
    ratio = per_token["responses"] / per_token["chat"]
    lines += ["", f"Per streamed token, a response costs {ratio:.2f}× the chat completion."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Record against a real sidecar, then measure on replay."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500, help="measured requests per case")
    parser.add_argument("--tokens", type=int, default=64, help="tokens a request")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the quietest counts")
    parser.add_argument("--out", type=Path, default=Path(".bench/results"))
    args = parser.parse_args(argv)
    import uvloop

    configure_logging("info", "text")
    sink = open(os.devnull, "w")  # noqa: SIM115
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(sink)
    with loadtest_sidecar("bench-responses-cpu-", MODEL) as (sidecar, tokenizer_dir):
        config = gateway_config(sidecar, tokenizer_dir)
        config["models"] = [m for m in config["models"] if m["name"] == MODEL]
        backend = ReplayingTritonBackend()
        client = InProcessClient(create_app(parse_settings(config), backend=backend))

        async def run() -> dict[tuple[str, bool], float]:
            inbox, task = await client.lifespan()
            try:
                for stream in (False, True):
                    await client.post(PATHS["chat"], body("chat", stream, args.tokens))
                backend.replaying = True
                return await measure(client, args.requests, args.tokens, args.rounds)
            finally:
                await inbox.put({"type": "lifespan.shutdown"})
                await task

        figures = uvloop.run(run())
    text = report(figures, args.requests, args.tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench-responses-cpu.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
