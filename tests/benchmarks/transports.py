"""The transports to Triton, side by side: what streaming a token costs the calling process.

One tritonserver serves the zero-compute load-test engine as the ``tensorrt_llm`` model (the
gateway's engine entry). The same requests (a short prompt, ``--tokens`` streamed tokens) are
sent at each concurrency through:

- ``grpc-aio``: grpcio's asyncio API, ``ModelStreamInfer`` (the gateway's transport before its
  own HTTP/2 client);
- ``grpc-h2``: the same calls on the backend's own HTTP/2 client (``adapters.triton.grpc.h2``);
- ``grpc-threads``: grpcio's synchronous streaming, one thread per request, each response
  handed to the event loop (what an asyncio gateway would have to do with it);
- ``http-sse``: Triton's HTTP ``generate_stream``, a connection per request, server-sent events
  parsed on the event loop (raw asyncio streams, msgspec for the JSON);
- ``http-gateway``: the same through the gateway's own HTTP/1.1 client
  (``adapters.triton.http.call``: kept-alive connections, a spare opened ahead);
- ``http-httpx``: the same through httpx's ``AsyncClient`` (its kept-alive pool, the events
  split from ``aiter_bytes`` and decoded with msgspec), the library the gateway's client is
  weighed against.

Each client decodes the output ids of every response, as the adapter does. Figures: tokens/s and
this process's CPU per streamed token and per request (all threads). ``python -m
tests.benchmarks.transports``.

``--backend`` measures the gateway's own path instead: ``TritonBackend`` streaming the
``ensemble`` entry (text in, text out) over ``grpc`` (``ModelStreamInfer``, the path to a Triton
without the response keeper) and over ``http`` (``generate_stream``), the two interleaved in each
round, on uvloop as in the gateway; the last lines give each one's median over the rounds and
gRPC's CPU per token as a multiple of HTTP's:
``python -m tests.benchmarks.transports --backend --levels 32 --rounds 3``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from adapters.contract import GenerationRequest, ModelTarget, SamplingParams
from adapters.triton import TritonBackend
from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.models import ensure_tiny_model
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from tests.benchmarks.transport_clients import (
    Send,
    grpc_aio,
    grpc_h2,
    grpc_threads,
    http_gateway,
    http_httpx,
    http_sse,
)


def backend_stream(
    backend: TritonBackend, target: ModelTarget, tokens: int
) -> Callable[[], Awaitable[Send]]:
    """Streams of the gateway's backend: one request of ``tokens`` tokens, its chunks' counts."""
    request = GenerationRequest(
        request_id="", prompt="The quick brown fox", params=SamplingParams(max_tokens=tokens),
        stream=True, timeout_s=60.0,
    )  # fmt: skip

    async def connect() -> Send:
        async def send() -> int:
            count = 0
            async for chunk in backend.generate(target, request):
                count += chunk.token_count or 0
            return count

        return send

    return connect


async def measure(
    connect: Callable[[], Awaitable[Send]], concurrency: int, seconds: float
) -> dict[str, float]:
    senders = [await connect() for _ in range(concurrency)]
    await asyncio.gather(*(send() for send in senders))  # warm up every connection
    tokens = requests = 0
    cpu, wall = time.process_time(), time.perf_counter()
    deadline = wall + seconds

    async def worker(send: Send) -> None:
        nonlocal tokens, requests
        while time.perf_counter() < deadline:
            count = await send()  # awaited first: `tokens += await ...` would lose updates
            tokens += count
            requests += 1

    await asyncio.gather(*(worker(send) for send in senders))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "tokens_per_s": tokens / wall,
        "cpu_us_per_token": 1e6 * cpu / max(tokens, 1),
        "cpu_us_per_request": 1e6 * cpu / max(requests, 1),
        "cpu_share": cpu / wall,
    }


def start_sidecar(instances: int) -> Sidecar:
    engine = {"kind": "loadtest", "tokenizer_dir": str(ensure_tiny_model()), "token_id": 11,
              "instances": instances}  # fmt: skip
    spec = parse_spec(
        {
            "models": [{"name": "lt", "release": "latest", "engine": engine,
                        "triton_max_batch_size": 256}],
            "sidecars": [{"name": "transports"}],
        }
    )  # fmt: skip
    sidecar = sidecar_from_spec(spec, spec.sidecars[0], Path(tempfile.mkdtemp()))
    sidecar.start()
    return sidecar


async def compare_backends(args: argparse.Namespace, sidecar: Sidecar) -> None:
    """The backend's gRPC and HTTP paths interleaved, then each one's medians and the ratio."""
    model = "lt_ensemble"
    targets = {
        "backend-grpc": ModelTarget(url=sidecar.grpc_url, triton_model=model, kind="ensemble"),
        "backend-http": ModelTarget(
            url=sidecar.grpc_url, triton_model=model, kind="ensemble", http_url=sidecar.http_url
        ),
    }
    print(f"{'transport':<14}{'streams':>8}{'tokens/s':>12}{'CPU µs/token':>14}"
          f"{'CPU µs/req':>12}{'cores':>7}")  # fmt: skip
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    async with TritonBackend() as backend:
        for _ in range(args.rounds):
            for concurrency in args.levels:
                for name, target in targets.items():
                    connect = backend_stream(backend, target, args.tokens)
                    r = await measure(connect, concurrency, args.seconds)
                    runs.setdefault((name, concurrency), []).append(r)
                    print(f"{name:<14}{concurrency:>8}{r['tokens_per_s']:>12,.0f}"
                          f"{r['cpu_us_per_token']:>14.1f}{r['cpu_us_per_request']:>12.0f}"
                          f"{r['cpu_share']:>7.2f}", flush=True)  # fmt: skip
    print(f"medians of {args.rounds} rounds, {args.tokens} tokens a stream:")
    for concurrency in args.levels:
        median = {
            name: statistics.median(r["cpu_us_per_token"] for r in runs[(name, concurrency)])
            for name in targets
        }
        rate = {
            name: statistics.median(r["tokens_per_s"] for r in runs[(name, concurrency)])
            for name in targets
        }
        print(f"{concurrency:>4} streams: gRPC {median['backend-grpc']:.1f} µs/token "
              f"({rate['backend-grpc']:,.0f} tokens/s), HTTP {median['backend-http']:.1f} "
              f"µs/token ({rate['backend-http']:,.0f} tokens/s): gRPC/HTTP "
              f"{median['backend-grpc'] / median['backend-http']:.2f}×", flush=True)  # fmt: skip


async def main_async(args: argparse.Namespace, sidecar: Sidecar) -> None:
    if args.backend:
        await compare_backends(args, sidecar)
        return
    host, port = sidecar.http_url.removeprefix("http://").split(":")
    pool = ThreadPoolExecutor(max(args.levels))
    transports = {
        "grpc-aio": grpc_aio(sidecar.grpc_url, args.tokens),
        "grpc-threads": grpc_threads(sidecar.grpc_url, args.tokens, pool),
        "grpc-h2": grpc_h2(sidecar.grpc_url, args.tokens),
        "http-sse": http_sse(host, int(port), args.tokens),
        "http-gateway": http_gateway(sidecar.http_url, args.tokens),
        "http-httpx": http_httpx(sidecar.http_url, args.tokens),
    }
    chosen = {name: transports[name] for name in args.transports or transports}
    print(f"{'transport':<14}{'streams':>8}{'tokens/s':>12}{'CPU µs/token':>14}"
          f"{'CPU µs/req':>12}{'cores':>7}")  # fmt: skip
    for _ in range(args.rounds):
        for concurrency in args.levels:
            for name, connect in chosen.items():
                r = await measure(connect, concurrency, args.seconds)
                print(f"{name:<14}{concurrency:>8}{r['tokens_per_s']:>12,.0f}"
                      f"{r['cpu_us_per_token']:>14.1f}{r['cpu_us_per_request']:>12.0f}"
                      f"{r['cpu_share']:>7.2f}", flush=True)  # fmt: skip
    pool.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--transports", nargs="+", help="only these (default: every one)")
    parser.add_argument(
        "--backend",
        action="store_true",
        help="the gateway's backend over gRPC and over HTTP, side by side",
    )
    args = parser.parse_args()
    sidecar = start_sidecar(args.instances)
    try:
        if args.backend:
            import uvloop

            # The gateway's event loop.
            uvloop.run(main_async(args, sidecar))
        else:
            asyncio.run(main_async(args, sidecar))
    finally:
        sidecar.stop()


if __name__ == "__main__":
    main()
