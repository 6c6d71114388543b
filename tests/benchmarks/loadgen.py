"""Closed-loop load: N workers each sending one request after another for a while, timing each.

Clients with as little overhead of their own as Python allows, so the server's cost shows: raw
HTTP/1.1 on kept-alive sockets (JSON bodies and server-sent events, chunked or not), and
Triton's gRPC ``ModelStreamInfer`` with one prebuilt request, on grpcio's channel or on the
backend's own HTTP/2 connection (``H2StreamClient``, 0.73 ms to a first response on 2 cores at
one stream against grpcio's 1.20).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc  # type: ignore[import-untyped]
import msgspec
from tritonclient.grpc import service_pb2, service_pb2_grpc

from adapters.triton.grpc.h2 import H2Connection
from adapters.triton.grpc.stream import STREAM_PATH, Channels
from adapters.triton.http.wire import read_head

_DONE = b"[DONE]"


@dataclass(slots=True)
class Sample:
    """One request as the client saw it: start, first token, end (seconds), token arrivals."""

    start: float
    first: float = 0.0
    end: float = 0.0
    tokens: int = 0
    gaps: list[float] = field(default_factory=list)
    error: str | None = None
    ramp: bool = False
    """The first request of a staggered worker, sent while the others were still starting."""
    request_id: str | None = None
    """The answer's ``x-request-id`` (the gateway's), by which its logs find the request."""

    def token(self) -> None:
        """A token arrived now."""
        now = time.perf_counter()
        if self.tokens:
            self.gaps.append(now - self.end)
        else:
            self.first = now
        self.tokens += 1
        self.end = now


@dataclass(frozen=True, slots=True)
class Stats:
    """The figures of one load level."""

    requests: int
    errors: int
    seconds: float
    tokens: int
    ttft_ms: tuple[float, float]
    itl_ms: tuple[float, float]
    e2e_ms: tuple[float, float]
    first_error: str | None

    @property
    def rps(self) -> float:
        """Completed requests per second."""
        return self.requests / self.seconds if self.seconds else 0.0


def percentiles(values: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds (zeros when there are no values)."""
    if not values:
        return (0.0, 0.0)
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (statistics.median(ordered) * 1e3, p99 * 1e3)


def summarize(samples: list[Sample], seconds: float) -> Stats:
    """Percentiles over the successful requests; errors counted apart."""
    good = [s for s in samples if s.error is None]
    errors = [s.error for s in samples if s.error is not None]
    return Stats(
        requests=len(good),
        errors=len(errors),
        seconds=seconds,
        tokens=sum(s.tokens for s in good),
        ttft_ms=percentiles([s.first - s.start for s in good]),
        itl_ms=percentiles([gap for s in good for gap in s.gaps]),
        e2e_ms=percentiles([s.end - s.start for s in good]),
        first_error=errors[0] if errors else None,
    )


Send = Callable[[Sample], Awaitable[None]]


async def run_level(
    connect: Callable[[], Awaitable[Send]],
    concurrency: int,
    seconds: float,
    request_timeout_s: float | None = None,
    stagger_s: float = 0.0,
    phase: float = 0.0,
    think_s: float = 0.0,
) -> tuple[list[Sample], float]:
    """``concurrency`` workers, each on its own connection, sending until ``seconds`` pass.

    With ``stagger_s``, worker ``k`` sends its first request ``stagger_s * (k + phase) /
    concurrency`` seconds in and every worker sends for ``seconds`` after that, so requests of
    equal length arrive spread over ``stagger_s`` instead of all at once (``phase`` in [0, 1)
    interleaves the workers of several load-generator processes). With ``think_s``, a worker
    waits that long after each answer before it sends the next request.

    Returns every finished request and the time from the start to the last one's end.
    """
    senders = [await connect() for _ in range(concurrency)]
    samples: list[Sample] = []
    started = time.perf_counter()
    deadline = started + stagger_s + seconds

    async def worker(index: int, send: Send) -> None:
        await asyncio.sleep(stagger_s * (index + phase) / concurrency)
        ramp = stagger_s > 0
        while time.perf_counter() < deadline:
            sample = Sample(start=time.perf_counter(), ramp=ramp)
            ramp = False
            try:
                async with asyncio.timeout(request_timeout_s):
                    await send(sample)
            except TimeoutError:
                sample.error = stalled(sample, request_timeout_s)
            except Exception as exc:
                sample.error = f"{type(exc).__name__}: {exc}"[:300]
            sample.end = time.perf_counter()
            samples.append(sample)
            if think_s:
                await asyncio.sleep(think_s)

    await asyncio.gather(*(worker(index, send) for index, send in enumerate(senders)))
    return samples, time.perf_counter() - started


def stalled(sample: Sample, timeout_s: float | None) -> str:
    """The error of a request that did not end in time: how far it came (no first token, or
    where its tokens stopped), and its request id."""
    if not sample.tokens:
        came = "no token"
    else:
        came = f"{sample.tokens} tokens, the last {time.perf_counter() - sample.end:.1f} s before"
    named = f", x-request-id {sample.request_id}" if sample.request_id else ""
    return f"TimeoutError: no end in {timeout_s:g} s: {came}{named}"


class HttpClient:
    """One kept-alive HTTP/1.1 connection sending the same POST again and again."""

    def __init__(
        self,
        host: str,
        port: int,
        path: str,
        body: dict[str, Any],
        key: str,
        is_token: Callable[[bytes], bool] | None = None,
        ends_with_done: bool = True,
    ) -> None:
        payload = msgspec.json.encode(body)
        self._is_token = is_token or _has_text
        """Whether an event carries a token (OpenAI chunks with text, by default)."""
        self._ends_with_done = ends_with_done
        """OpenAI streams end with ``[DONE]``; Triton's ``generate_stream`` just ends."""
        self._stream = bool(body.get("stream") or body.get("streaming"))
        """OpenAI's ``stream`` or Triton's ``streaming`` input."""
        self._request = _post(path, host, port, key, payload)
        self._host, self._port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        folder = os.environ.get("FIRST_TOKEN_MARKS")
        self._marks = (
            DirectMarks(folder, path, host, port, key, body)
            if folder and "input_ids" in body
            else None
        )
        """Direct Triton's requests marked for ``tests.benchmarks.marks_report``, if asked."""

    async def send(self, sample: Sample) -> None:
        """Send once and read the whole answer, timing its tokens."""
        if self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        marks = self._marks
        try:
            writer.write(self._request if marks is None else marks.request())
            if marks is not None:
                marks.written()
            status, headers = await read_head(reader)
            if b"x-request-id" in headers:
                sample.request_id = headers[b"x-request-id"].decode(errors="replace")
            if self._stream and status == 200:
                await self._events(reader, headers, sample)
            else:
                body = await _body(reader, headers)
                if status != 200:
                    raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
                sample.first = time.perf_counter()
                sample.tokens = _usage_tokens(body)
            if headers.get(b"connection", b"").lower() == b"close":
                writer.close()
            if marks is not None:
                marks.ended(sample)
        except BaseException:
            writer.close()
            self._writer = None
            raise

    async def _events(self, reader: asyncio.StreamReader, headers: Headers, sample: Sample) -> None:
        buffer = b""
        done = False
        # Read to the body's end even after [DONE], so the connection can be used again.
        async for piece in _pieces(reader, headers):
            buffer += piece
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                data = event.removeprefix(b"data: ")
                if data == _DONE:
                    done = True
                if self._is_token(data):
                    if not sample.tokens and self._marks is not None:
                        self._marks.arrived()
                    sample.token()
                elif b'"completion_tokens"' in data:
                    # Chunks joined under backpressure carry several tokens: usage counts them.
                    sample.tokens = max(sample.tokens, _usage_tokens(data))
                elif b'"error"' in data[:12]:
                    raise RuntimeError(f"in-band error: {data[:200]!r}")
        if not done and self._ends_with_done:
            raise RuntimeError("the stream ended without [DONE]")


Headers = dict[bytes, bytes]


def _post(path: str, host: str, port: int, key: str, payload: bytes) -> bytes:
    """An HTTP/1.1 POST of a JSON ``payload``, with the bearer ``key``."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {key}\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload


_RUN = f"{os.getpid()}.{time.time_ns()}"
_SERIALS = itertools.count()


class DirectMarks:
    """A direct Triton client's marks, in the host's monotonic nanoseconds as the gateway's and
    the engine stubs' are: each request gets an id of its own, ``direct-<process>-<serial>``
    (which the stubs record as its Triton id), and a line in ``direct-<pid>.jsonl`` with when it
    was written (``triton.written``) and when its first token was read (``triton.arrived``)."""

    def __init__(
        self, folder: str, path: str, host: str, port: int, key: str, body: dict[str, Any]
    ) -> None:
        self._out = open(f"{folder}/direct-{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115
        self._post = functools.partial(_post, path, host, port, key)
        self._body = body
        self._current: dict[str, Any] = {}

    def request(self) -> bytes:
        """The next request's bytes, with its own id."""
        triton_id = f"direct-{_RUN}-{next(_SERIALS)}"
        self._current = {"triton_id": triton_id}
        return self._post(msgspec.json.encode({"id": triton_id, **self._body}))

    def written(self) -> None:
        self._current["triton.written"] = time.monotonic_ns()

    def arrived(self) -> None:
        self._current["triton.arrived"] = time.monotonic_ns()

    def ended(self, sample: Sample) -> None:
        if sample.error is None and "triton.arrived" in self._current:
            self._out.write(json.dumps(self._current) + "\n")


async def _pieces(reader: asyncio.StreamReader, headers: Headers) -> Any:
    """The body as it arrives: chunked transfer, a fixed length, or until the socket closes."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]
    elif b"content-length" in headers:
        yield await reader.readexactly(int(headers[b"content-length"]))
    else:
        while piece := await reader.read(65536):
            yield piece


async def _body(reader: asyncio.StreamReader, headers: Headers) -> bytes:
    return b"".join([piece async for piece in _pieces(reader, headers)])


_TEXT_KEYS = (b'"content":"', b'"text":"')


def has_output_ids(data: bytes) -> bool:
    """Whether an event of Triton's ``generate_stream`` from the engine carries tokens."""
    return b'"output_ids"' in data


def _has_text(data: bytes) -> bool:
    """Whether an OpenAI chunk carries generated text (not the role-only or closing chunk)."""
    for key in _TEXT_KEYS:
        at = data.find(key)
        if at >= 0 and data[at + len(key) : at + len(key) + 1] != b'"':
            return True
    return False


def _usage_tokens(body: bytes) -> int:
    usage = msgspec.json.decode(body).get("usage") or {}
    return int(usage.get("completion_tokens") or 0)


class TritonStreamClient:
    """Direct Triton: one prebuilt ``ModelInferRequest`` sent on ``ModelStreamInfer`` each time."""

    def __init__(self, channel: grpc.aio.Channel, request: service_pb2.ModelInferRequest) -> None:
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        self._request = request

    async def send(self, sample: Sample) -> None:
        """One request; every non-empty response counts as its tokens."""
        call = self._stub.ModelStreamInfer(iter([self._request]))
        async for response in call:
            if response.error_message:
                raise RuntimeError(response.error_message)
            infer = response.infer_response
            if infer.raw_output_contents and any(infer.raw_output_contents):
                sample.token()
            final = infer.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
        call.cancel()


class H2StreamClient:
    """Direct Triton over gRPC on the backend's HTTP/2 client: one prebuilt request message
    (``ModelInferRequest`` bytes) sent on ``ModelStreamInfer`` each time, every call of a load
    process on its one connection, as the gateway's calls share one a worker."""

    def __init__(self, channels: Channels, url: str, message: bytes) -> None:
        self._channels = channels
        self._url = url
        self._message = message

    async def send(self, sample: Sample) -> None:
        """One request; every response with output contents counts as a token."""
        connection: H2Connection = await self._channels.connect(self._url)
        counted = _Counted(sample)
        connection.open(STREAM_PATH, self._message, {}, 600.0, counted)
        await counted.ended


class _Counted:
    """A direct gRPC call's responses, counted into its sample as they arrive."""

    def __init__(self, sample: Sample) -> None:
        self._sample = sample
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_message(self, message: bytes) -> None:
        response = service_pb2.ModelStreamInferResponse.FromString(message)
        if response.error_message:
            if not self.ended.done():
                self.ended.set_exception(RuntimeError(response.error_message))
            return
        if any(response.infer_response.raw_output_contents):
            self._sample.token()

    def on_end(self, failure: BaseException | None) -> None:
        if self.ended.done():
            return
        if failure is None:
            self.ended.set_result(None)
        else:
            self.ended.set_exception(failure)
