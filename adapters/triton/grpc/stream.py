"""Triton's gRPC ``ModelStreamInfer``: one request per call, its responses read as replies.

Why it exists beside the HTTP transport, measured: it keeps every response where Triton's HTTP
frontend loses some (``python -m tests.benchmarks.stream_integrity --http-threads 1``, at the
usual 212,992-byte socket buffer and without the response keeper: 1,536 of 1,536 gRPC streams
whole against 1,514 of 1,643 over HTTP; docs/results/stream-integrity.md), and it carries what
JSON cannot (LoRA weights in 16-bit floats, beams). Its calls run on the gateway's own HTTP/2
client (``h2.py``), one connection to each server shared by every call to it (``Channels``);
each response is parsed once and its outputs read from their raw contents
(``RawOutputs``: texts, counts and ids straight from the bytes, an array only where a caller
asks for one). On 2 shared cores (``python -m tests.benchmarks.transports --backend --levels 32
--rounds 3``, medians of 3 runs) the backend's CPU per streamed token went from 19.1 to 19.5 µs,
1.44 to 1.49 times the HTTP path's, with numpy arrays per output, to 15.4 to 18.1 µs, 1.25 to
1.50 times (docs/deployment/transports.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import grpc  # type: ignore[import-untyped]
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, KeepAliveOptions, service_pb2
from tritonclient.utils import InferenceServerException

from adapters.contract import BackendError, BackendTimeout
from adapters.triton.errors import HttpError, classify
from adapters.triton.grpc.h2 import H2Connection, Stream
from adapters.triton.grpc.replies import ReplyReader
from adapters.triton.grpc.status import rpc_error
from adapters.triton.responses import Reply
from adapters.triton.wire import WireTensor

STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
_DRAIN_S = 1.0


def infer_request(
    model_name: str,
    request_id: str,
    tensors: Sequence[WireTensor],
    outputs: Sequence[str] | None,
    *,
    priority: int = 0,
    request_type: str | None = None,
) -> service_pb2.ModelInferRequest:
    """A ``ModelInferRequest`` with raw tensor contents that asks for an empty final response.

    ``priority`` sets Triton's request priority (1 is the highest level) where it is above 0;
    ``request_type`` is TensorRT-LLM's phase of a disaggregated request, where set.
    """
    message = service_pb2.ModelInferRequest(model_name=model_name, id=request_id)
    for tensor in tensors:
        entry = message.inputs.add()
        entry.name = tensor.name
        entry.datatype = tensor.datatype
        entry.shape.extend(tensor.array.shape)
        message.raw_input_contents.append(tensor.raw_bytes())
    for name in outputs or ():
        message.outputs.add().name = name
    message.parameters["triton_enable_empty_final_response"].bool_param = True
    if priority > 0:
        message.parameters["priority"].uint64_param = priority
    if request_type is not None:
        message.parameters["request_type"].string_param = request_type
    return message


CallOpener = Callable[[str, service_pb2.ModelInferRequest, float], Any]
"""Starts a ``ModelStreamInfer`` call carrying one request on the client of a URL."""


def open_stream(
    stub: Any,
    request: service_pb2.ModelInferRequest,
    timeout: float,
    metadata: Mapping[str, str] | None = None,
) -> Any:
    """Start a ``ModelStreamInfer`` call carrying one request on a client's ``stub``.

    tritonclient's asyncio ``stream_infer`` refuses the reserved
    ``triton_enable_empty_final_response`` parameter, so the request is built here and sent on
    the client's own stub. The client side is half-closed at once; Triton ends the stream after
    the request's final response.
    """
    return stub.ModelStreamInfer(
        iter([request]), timeout=timeout, metadata=tuple((metadata or {}).items()) or None
    )


class Call(Protocol):
    """A request on its way to Triton, whichever the transport."""

    def start(self) -> None:
        """Send the request now where that takes no wait; else it goes at the first read."""
        ...

    async def read(self) -> list[Reply] | None:
        """The responses that arrived (at least one); ``None`` once the stream ended."""
        ...

    async def drain(self, timeout_s: float = ...) -> bool:
        """Read to the stream's end, so the transport closes cleanly and closing it cancels
        nothing; whether it ended within ``timeout_s``."""
        ...

    def cancel(self) -> None:
        """End the call; Triton cancels the request if it still runs."""
        ...

    def ended(self) -> bool:
        """Whether the call has ended (read to its end, failed or cancelled)."""
        ...


class Channels:
    """The HTTP/2 connections to gRPC servers by address (``host:port``): one in use for each,
    shared by every call, dialled when a call needs it."""

    def __init__(self) -> None:
        self._connections: dict[str, H2Connection] = {}
        self._dialling: dict[str, asyncio.Future[H2Connection]] = {}

    def ready(self, url: str) -> H2Connection | None:
        """The address's connection where it can take a call now."""
        connection = self._connections.get(url)
        return connection if connection is not None and connection.has_room() else None

    async def connect(self, url: str) -> H2Connection:
        """The address's connection, dialled where none can take a call (one dial for every
        caller waiting; a caller cancelled leaves it to the others)."""
        connection = self.ready(url)
        if connection is not None:
            return connection
        dialling = self._dialling.get(url)
        if dialling is None:
            dialling = asyncio.ensure_future(self._dial(url))
            self._dialling[url] = dialling
            dialling.add_done_callback(lambda done: self._dialled(url, done))
        return await asyncio.shield(dialling)

    async def close(self) -> None:
        """Close every connection."""
        for dialling in self._dialling.values():
            dialling.cancel()
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()

    async def _dial(self, url: str) -> H2Connection:
        host, _, port = url.rpartition(":")
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(
            lambda: H2Connection(url), host.strip("[]"), int(port)
        )
        return connection

    def _dialled(self, url: str, done: asyncio.Future[H2Connection]) -> None:
        if self._dialling.get(url) is done:
            del self._dialling[url]
        if done.cancelled():
            return
        if done.exception() is None:
            previous = self._connections.get(url)
            self._connections[url] = done.result()
            if previous is not None:
                previous.retire()


class GrpcCall:
    """A ``ModelStreamInfer`` call on the backend's HTTP/2 client (``grpc/h2.py``): the
    connection's reads queue its messages, parsed when the caller takes them.

    ``read`` hands over every message queued, at least one, as the HTTP call does with its
    events: where the caller keeps up that is one reply a read; where it fell behind, the replies
    waiting become one chunk. A message costs no future, timer or task of its own.

    Cancelling the caller's read leaves the call running: the caller ends it through ``cancel``
    or ``drain`` (``Stopper.release``). A running ensemble request that is cancelled stays
    counted in flight in Triton 2.51 for good, so an ensemble's call is opened with a deadline
    later than the request's, ``deadline``, at which a read that has to wait raises
    ``TimeoutError`` while the call stays open, for its stop request and drain.
    """

    def __init__(
        self,
        channels: Channels,
        url: str,
        request: service_pb2.ModelInferRequest,
        timeout: float,
        metadata: Mapping[str, str] | None,
        outputs: Sequence[str],
        *,
        deadline: float | None = None,
    ) -> None:
        self._channels = channels
        self._url = url
        self._message = request.SerializeToString()
        self._timeout = timeout
        self._metadata = metadata or {}
        self._replies = ReplyReader(outputs)
        self._deadline = deadline
        self._messages: list[bytes] = []
        self._failure: BaseException | None = None
        self._started = False
        self._ended = False
        """The stream ended or failed, or the call was cancelled: nothing more is queued."""
        self._stream: Stream | None = None
        self._dialling: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        """The call's own deadline (Triton keeps it too, from ``grpc-timeout``)."""
        self._expiry: asyncio.TimerHandle | None = None
        self._expired = False

    def start(self) -> None:
        """Send the request: at once on the server's connection, else once it is dialled."""
        if self._started or self._ended:
            return
        self._started = True
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._timeout, self._timed_out)
        if self._deadline is not None:
            self._expiry = loop.call_at(self._deadline, self._expire)
        connection = self._channels.ready(self._url)
        if connection is not None:
            self._open(connection)
        else:
            self._dialling = asyncio.ensure_future(self._dial())

    async def read(self) -> list[Reply] | None:
        """The replies that arrived (at least one); ``None`` at the stream's end."""
        return await self._take(draining=False)

    async def drain(self, timeout_s: float = _DRAIN_S) -> bool:
        """Read to the stream's end (a call that ended, cancelled included, has none); whether
        it ended within ``timeout_s``."""
        if self.ended():
            return True
        try:
            async with asyncio.timeout(timeout_s):
                while await self._take(draining=True) is not None:
                    pass
            return True
        except (TimeoutError, grpc.RpcError):
            self.cancel()
            return False

    def cancel(self) -> None:
        """Reset the stream (Triton cancels the request if it still runs)."""
        if not self._ended:
            self._end_with(asyncio.CancelledError())

    def ended(self) -> bool:
        """Whether the call has its status (read to its end, failed or cancelled), or was
        never sent."""
        return self._ended or not self._started

    def on_message(self, message: bytes) -> None:
        self._messages.append(message)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_end(self, failure: BaseException | None) -> None:
        self._stream = None
        self._failure = failure
        self._ended = True
        for timer in (self._timer, self._expiry):
            if timer is not None:
                timer.cancel()
        self._timer = self._expiry = None
        self._wake()

    def _open(self, connection: H2Connection) -> None:
        self._stream = connection.open(
            STREAM_PATH, self._message, self._metadata, self._timeout, self
        )

    async def _dial(self) -> None:
        try:
            connection = await self._channels.connect(self._url)
        except asyncio.CancelledError:
            return
        except Exception as exc:
            self.on_end(exc)
            return
        if not self._ended:
            self._open(connection)

    def _end_with(self, failure: BaseException) -> None:
        """End the call here: reset its stream, or stop dialling for it."""
        if self._dialling is not None:
            self._dialling.cancel()
            self._dialling = None
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()
        self.on_end(failure)

    def _timed_out(self) -> None:
        self._timer = None
        self._end_with(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    async def _take(self, *, draining: bool) -> list[Reply] | None:
        """What is queued, as replies; waits for a message where none is (past the request's
        deadline, unless ``draining``, the wait raises ``TimeoutError``)."""
        self.start()
        while not self._messages:
            if self._ended:
                if self._failure is not None:
                    raise self._failure
                return None
            if self._expired and not draining:
                raise TimeoutError
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        messages, self._messages = self._messages, []
        read = self._replies.read
        return [read(message) for message in messages]

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _expire(self) -> None:
        """The request's deadline passed: a read waiting, or the next one that has to wait,
        raises ``TimeoutError``; the call stays open (its own deadline is later)."""
        self._expiry = None
        self._expired = True
        self._wake()


def reconnecting_channel_args(max_backoff_s: float) -> list[tuple[str, Any]]:
    """tritonclient's channel options, plus reconnection attempts at most ``max_backoff_s``
    apart (gRPC's default grows to two minutes), so a restarted server is reached again soon."""
    keepalive = KeepAliveOptions()
    backoff_ms = max(int(max_backoff_s * 1000), 100)
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", min(backoff_ms, 1000)),
        ("grpc.min_reconnect_backoff_ms", min(backoff_ms, 1000)),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
    ]


@contextmanager
def map_triton_errors(operation: str) -> Iterator[None]:
    """Re-raise gRPC, tritonclient and timeout failures as the contract's ``BackendError``s."""
    try:
        yield
    except BackendError:
        raise
    except grpc.RpcError as exc:
        code = exc.code() if callable(getattr(exc, "code", None)) else None
        details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
        raise classify(f"{operation}: {details}", getattr(code, "name", None)) from exc
    except InferenceServerException as exc:
        raise classify(f"{operation}: {exc.message()}", exc.status()) from exc
    except HttpError as exc:
        raise classify(f"{operation}: {exc}", exc.status_name) from exc
    except TimeoutError as exc:
        raise BackendTimeout(f"{operation}: timed out") from exc
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise classify(
            f"{operation}: the connection ended mid-answer: {exc}", "UNAVAILABLE"
        ) from exc
    except OSError as exc:
        raise classify(f"{operation}: failed to connect: {exc}", "UNAVAILABLE") from exc
