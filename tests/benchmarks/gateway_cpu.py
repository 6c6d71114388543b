"""``make bench``: the gateway's own CPU per request and per streamed token, without its neighbours.

The serving benchmark measures the gateway as deployed: its CPU then includes the HTTP server,
grpcio's asyncio client (its poller thread and a wake-up per streamed message) and the kernel's
loopback traffic, and on a shared 2-core machine it moves with everything else running. This
benchmark isolates the code this project owns: the gateway app (auth, rate limiter, templating,
tokenizing, planning, generation, detokenizing, observability, response shaping, SSE framing) is
driven as an ASGI app in this process, and the Triton calls are answered by replaying what a
real tritonserver (the zero-compute load-test engine) answered to the same requests: the bytes
of its HTTP ``generate_stream`` answers, one event a read, or its gRPC responses.

Printed as a table (CPU µs per request, whole and streamed, and per streamed token) and written
to ``bench-gateway-cpu.md`` in ``--out`` (default ``.bench/results``, untracked).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from litestar.types import Message

from adapters.triton.replay import ReplayingTritonBackend
from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.models import ensure_tiny_model
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from gateway.app import create_app
from gateway.observability.logs import configure_logging
from gateway.settings import parse_settings
from tests.benchmarks.serving import KEY, RESULTS, TOKENS, gateway_config, http_body

ROUNDS = 3
CASES = [
    (endpoint, model, stream)
    for endpoint in ("completions", "chat")
    for model in ("loadtest", "loadtest-engine")
    for stream in (False, True)
]


@contextlib.contextmanager
def loadtest_sidecar(prefix: str, name: str = "loadtest") -> Iterator[tuple[Sidecar, Path]]:
    """A sidecar serving the tiny model's tokenizer on the load-test engine as ``name``, in a
    scratch folder named from ``prefix``, once ready; with the tokenizer's folder."""
    tokenizer_dir = ensure_tiny_model()
    engine = {"kind": "loadtest", "tokenizer_dir": str(tokenizer_dir)}
    spec = parse_spec(
        {
            "models": [{"name": name, "release": "latest", "engine": engine}],
            "sidecars": [{"name": "cpu"}],
        }
    )
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        sidecar = sidecar_from_spec(spec, spec.sidecars[0], Path(scratch))
        with sidecar:
            sidecar.wait_ready(300, first_start=True)
            yield sidecar, tokenizer_dir


class InProcessClient:
    """Drives an ASGI app directly, as uvicorn would, and checks each answer is a 200."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def lifespan(self) -> tuple[asyncio.Queue[Message], asyncio.Task[None]]:
        """Start the app; put ``lifespan.shutdown`` in the queue and await the task to stop."""
        inbox: asyncio.Queue[Message] = asyncio.Queue()
        outbox: asyncio.Queue[Message] = asyncio.Queue()
        await inbox.put({"type": "lifespan.startup"})
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        task = asyncio.ensure_future(self.app(scope, inbox.get, outbox.put))
        started = await outbox.get()
        if started["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the app did not start: {started}")
        return inbox, task

    async def post(self, path: str, body: dict[str, Any]) -> int:
        """One request; returns the number of body messages sent."""
        raw = msgspec.json.encode(body)
        headers = [
            (b"host", b"bench"),
            (b"content-type", b"application/json"),
            (b"authorization", f"Bearer {KEY}".encode()),
            (b"content-length", str(len(raw)).encode()),
        ]
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": headers, "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 2), "state": {},
        }  # fmt: skip
        done = asyncio.Event()
        delivered = False
        sent: list[Message] = []

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await done.wait()  # uvicorn reports a disconnect once the answer is complete
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        await self.app(scope, receive, send)
        # A turn of the event loop, as a server's loop takes between requests: what the request
        # left scheduled (its disconnect watchers' cancellation, say) runs and is counted. A
        # request whose Triton answers are replayed never waits, so without it nothing
        # scheduled would ever run, and the tasks and timers would pile up.
        await asyncio.sleep(0)
        if sent[0].get("status") != 200:
            raise RuntimeError(f"{path} answered {sent}")
        return len(sent) - 1


async def measure(
    client: InProcessClient, requests: int, tokens: int = TOKENS, rounds: int = ROUNDS
) -> dict[tuple[str, str, bool], float]:
    """CPU µs per request of every case (the best of ``rounds``), after a warm-up each."""
    figures = {}
    for endpoint, model, stream in CASES:
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        body = http_body(endpoint, model, stream, tokens)
        for _ in range(100):
            await client.post(path, body)
        taken = []
        for _ in range(rounds):
            start = time.process_time()
            for _ in range(requests // rounds):
                await client.post(path, body)
            taken.append(1e6 * (time.process_time() - start) / (requests // rounds))
        # The quietest round, as timeit does: what the code costs, not what the machine did.
        figures[(endpoint, model, stream)] = min(taken)
        mode = "stream" if stream else "whole"
        cpu = figures[(endpoint, model, stream)]
        print(f"{endpoint:11} {model:16} {mode:6} {cpu:8.1f} µs/request", flush=True)
    return figures


def report(
    figures: dict[tuple[str, str, bool], float],
    requests: int,
    tokens: int = TOKENS,
    rounds: int = ROUNDS,
) -> str:
    """The Markdown table."""
    lines = [
        "# The gateway's own CPU, Triton's responses replayed",
        "",
        f"{time.strftime('%Y-%m-%d')}; `python -m tests.benchmarks.gateway_cpu`; "
        f"{requests} requests per case, one at a time, {tokens} tokens each, the best of "
        f"{rounds} rounds; auth, rate limiter, metrics and access log on; no HTTP server, "
        "no Triton server (see the module's docstring).",
        "",
        "| endpoint | entry | CPU per request, whole | CPU per request, streamed "
        "| CPU per streamed token |",
        "|---|---|---|---|---|",
    ]
    for endpoint in ("completions", "chat"):
        for model, entry in (("loadtest", "ensemble"), ("loadtest-engine", "tensorrt_llm")):
            whole = figures[(endpoint, model, False)]
            streamed = figures[(endpoint, model, True)]
            lines.append(
                f"| {endpoint} | {entry} | {whole:,.0f} µs | {streamed:,.0f} µs "
                f"| {(streamed - whole) / tokens:,.1f} µs |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Record against a real sidecar, then measure on replay."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="measured requests per case")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the report")
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help="rounds a case; the quietest is reported"
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=TOKENS,
        help="tokens a request (more put the per-token figure less under each streamed "
        "request's own cost)",
    )
    args = parser.parse_args(argv)
    import uvloop

    # As `triton-gateway serve` logs: one access line per request, formatted and written.
    configure_logging("info", "text")
    sink = open(os.devnull, "w")  # noqa: SIM115
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(sink)
    with loadtest_sidecar("bench-gateway-cpu-") as (sidecar, tokenizer_dir):
        config = gateway_config(sidecar, tokenizer_dir)
        config["models"] = [m for m in config["models"] if m["name"].startswith("loadtest")]
        backend = ReplayingTritonBackend()
        client = InProcessClient(create_app(parse_settings(config), backend=backend))

        async def run() -> dict[tuple[str, str, bool], float]:
            inbox, task = await client.lifespan()
            try:
                for endpoint, model, stream in CASES:
                    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
                    await client.post(path, http_body(endpoint, model, stream, args.tokens))
                backend.replaying = True
                return await measure(client, args.requests, args.tokens, args.rounds)
            finally:
                await inbox.put({"type": "lifespan.shutdown"})
                await task

        figures = uvloop.run(run())
    text = report(figures, args.requests, args.tokens, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench-gateway-cpu.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
