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

import grpc  # type: ignore[import-untyped]
import httpx
import msgspec
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from adapters.contract import GenerationRequest, ModelTarget, SamplingParams
from adapters.triton import TritonBackend
from adapters.triton.grpc.stream import STREAM_PATH, Channels, infer_request
from adapters.triton.http.call import HttpStreams
from adapters.triton.wire import WireTensor
from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.models import ensure_tiny_model
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar

MODEL = "lt_tensorrt_llm"
PROMPT = [5, 7, 9, 10, 11, 12, 13, 14]
Send = Callable[[], Awaitable[int]]


def _request(tokens: int) -> service_pb2.ModelInferRequest:
    arrays = {
        "input_ids": np.array([PROMPT], np.int32),
        "input_lengths": np.array([[len(PROMPT)]], np.int32),
        "request_output_len": np.array([[tokens]], np.int32),
        "end_id": np.array([[2]], np.int32),
        "streaming": np.array([[True]]),
    }
    tensors = [
        WireTensor(name, "BOOL" if a.dtype == bool else "INT32", a) for name, a in arrays.items()
    ]
    return infer_request(MODEL, "bench", tensors, ["output_ids", "sequence_length"])


def _ids(response: service_pb2.ModelStreamInferResponse) -> int:
    infer = response.infer_response
    if response.error_message:
        raise RuntimeError(response.error_message)
    for tensor, raw in zip(infer.outputs, infer.raw_output_contents, strict=False):
        if tensor.name == "output_ids":
            return int(np.frombuffer(raw, np.int32).size)
    return 0


def _final(response: service_pb2.ModelStreamInferResponse) -> bool:
    final = response.infer_response.parameters.get("triton_final_response")
    return final is not None and final.bool_param


def grpc_aio(url: str, tokens: int) -> Callable[[], Awaitable[Send]]:
    stubs: list[service_pb2_grpc.GRPCInferenceServiceStub] = []

    async def connect() -> Send:
        # One channel for every request, as the gateway keeps one per server.
        if not stubs:
            stubs.append(service_pb2_grpc.GRPCInferenceServiceStub(grpc.aio.insecure_channel(url)))
        stub = stubs[0]
        request = _request(tokens)

        async def send() -> int:
            count = 0
            call = stub.ModelStreamInfer(iter([request]))
            async for response in call:
                count += _ids(response)
                if _final(response):
                    break
            call.cancel()
            return count

        return send

    return connect


class _Collected:
    """A ``grpc_h2`` stream's messages, counted as they come."""

    def __init__(self) -> None:
        self.count = 0
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_message(self, message: bytes) -> None:
        self.count += _ids(service_pb2.ModelStreamInferResponse.FromString(message))

    def on_end(self, failure: BaseException | None) -> None:
        if failure is None:
            self.ended.set_result(None)
        else:
            self.ended.set_exception(failure)


def grpc_h2(url: str, tokens: int) -> Callable[[], Awaitable[Send]]:
    channels = Channels()

    async def connect() -> Send:
        request = _request(tokens).SerializeToString()

        async def send() -> int:
            collected = _Collected()
            connection = await channels.connect(url)
            connection.open(STREAM_PATH, request, {}, 60.0, collected)
            await collected.ended
            return collected.count

        return send

    return connect


def grpc_threads(url: str, tokens: int, pool: ThreadPoolExecutor) -> Callable[[], Awaitable[Send]]:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(url))

    async def connect() -> Send:
        request = _request(tokens)
        loop = asyncio.get_running_loop()

        async def send() -> int:
            queue: asyncio.Queue[service_pb2.ModelStreamInferResponse | None] = asyncio.Queue()

            def pump() -> None:
                call = stub.ModelStreamInfer(iter([request]))
                for response in call:
                    loop.call_soon_threadsafe(queue.put_nowait, response)
                    if _final(response):
                        break
                call.cancel()
                loop.call_soon_threadsafe(queue.put_nowait, None)

            done = loop.run_in_executor(pool, pump)
            count = 0
            while (response := await queue.get()) is not None:
                count += _ids(response)
            await done
            return count

        return send

    return connect


class _Event(msgspec.Struct):
    output_ids: int | list[int] | None = None
    error: str | None = None


def http_sse(host: str, port: int, tokens: int) -> Callable[[], Awaitable[Send]]:
    body = _body(tokens)
    head = (
        f"POST /v2/models/{MODEL}/generate_stream HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    decoder = msgspec.json.Decoder(_Event)

    async def connect() -> Send:
        async def send() -> int:
            reader, writer = await asyncio.open_connection(host, port)
            try:
                return await _read_events(reader, writer, head + body, decoder)
            finally:
                writer.close()

        return send

    return connect


def _body(tokens: int) -> bytes:
    return msgspec.json.encode(
        {
            "input_ids": PROMPT,
            "input_lengths": [len(PROMPT)],
            "request_output_len": [tokens],
            "end_id": [2],
            "streaming": [True],
        }
    )


def http_gateway(url: str, tokens: int) -> Callable[[], Awaitable[Send]]:
    streams = HttpStreams()
    body = _body(tokens)

    async def connect() -> Send:
        async def send() -> int:
            call = streams.call(url, MODEL, body)
            count = 0
            while (replies := await call.read()) is not None:
                for reply in replies:
                    if reply.error:
                        raise RuntimeError(reply.error)
                    ids = reply.outputs.get("output_ids")
                    count += 0 if ids is None else int(ids.size)
            return count

        return send

    return connect


def http_httpx(url: str, tokens: int) -> Callable[[], Awaitable[Send]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    client = httpx.AsyncClient(base_url=url, limits=limits, timeout=None)
    body = _body(tokens)
    decoder = msgspec.json.Decoder(_Event)
    path = f"/v2/models/{MODEL}/generate_stream"

    async def connect() -> Send:
        async def send() -> int:
            count = 0
            buffer = b""
            async with client.stream("POST", path, content=body) as response:
                async for data in response.aiter_bytes():
                    buffer += data
                    *events, buffer = buffer.split(b"\n\n")
                    for event in events:
                        parsed = decoder.decode(event[6:])
                        if parsed.error:
                            raise RuntimeError(parsed.error)
                        ids = parsed.output_ids
                        count += 1 if isinstance(ids, int) else len(ids or ())
            return count

        return send

    return connect


async def _read_events(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    request: bytes,
    decoder: msgspec.json.Decoder[_Event],
) -> int:
    """Send one request and read its chunked server-sent events; how many ids they carried."""
    writer.write(request)
    await reader.readuntil(b"\r\n\r\n")
    count = 0
    buffer = b""
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return count
        buffer += chunk[:-2]
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            parsed = decoder.decode(event[6:])
            if parsed.error:
                raise RuntimeError(parsed.error)
            ids = parsed.output_ids
            count += 1 if isinstance(ids, int) else len(ids or ())


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
