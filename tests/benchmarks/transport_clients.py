"""The clients ``python -m tests.benchmarks.transports`` runs side by side: one Triton call of
``tokens`` streamed tokens over each transport (grpcio's asyncio API, the backend's own HTTP/2
client, grpcio's threads, raw server-sent events, the gateway's HTTP/1.1 client, httpx), each
counting the output ids of every response as the adapter does. A client is a ``connect`` that
opens what it keeps between requests and returns a ``send``: one request, its ids counted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import grpc  # type: ignore[import-untyped]
import httpx
import msgspec
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from adapters.triton.grpc.stream import STREAM_PATH, Channels, infer_request
from adapters.triton.http.call import HttpStreams
from adapters.triton.wire import WireTensor

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
                    ids, buffer = _ids_of_events(buffer + data, decoder)
                    count += ids
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
        ids, buffer = _ids_of_events(buffer + chunk[:-2], decoder)
        count += ids


def _ids_of_events(buffer: bytes, decoder: msgspec.json.Decoder[_Event]) -> tuple[int, bytes]:
    """How many ids the whole server-sent events in ``buffer`` carry, and the incomplete event
    that follows them."""
    *events, rest = buffer.split(b"\n\n")
    count = 0
    for event in events:
        parsed = decoder.decode(event[6:])
        if parsed.error:
            raise RuntimeError(parsed.error)
        ids = parsed.output_ids
        count += 1 if isinstance(ids, int) else len(ids or ())
    return count, rest
