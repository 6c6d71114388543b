"""Triton's gRPC ``ModelStreamInfer``: one request per call, its responses read as replies.

Why it exists beside the HTTP transport, measured: it keeps every response where Triton's HTTP
frontend loses some (``python -m tests.benchmarks.stream_integrity --http-threads 1``, at the
usual 212,992-byte socket buffer and without the response keeper: 1,536 of 1,536 gRPC streams
whole against 1,514 of 1,643 over HTTP; docs/results/stream-integrity.md), and it carries what
JSON cannot (LoRA weights in 16-bit floats, beams). It uses grpcio's asyncio API: 70 to 121 µs
of CPU per token on the transports bench, against 132 to 158 for grpcio's synchronous streaming
on threads (docs/deployment/transports.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import grpc  # type: ignore[import-untyped]
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, InferResult, KeepAliveOptions, service_pb2
from tritonclient.utils import InferenceServerException

from adapters.contract import BackendError, BackendTimeout
from adapters.triton.errors import HttpError, classify
from adapters.triton.responses import Reply
from adapters.triton.wire import WireTensor, wire_array

_FINAL = "triton_final_response"
_DRAIN_S = 1.0


def infer_request(
    model_name: str,
    request_id: str,
    tensors: Sequence[WireTensor],
    outputs: Sequence[str] | None,
    *,
    priority: int = 0,
) -> service_pb2.ModelInferRequest:
    """A ``ModelInferRequest`` with raw tensor contents that asks for an empty final response.

    ``priority`` sets Triton's request priority (1 is the highest level) where it is above 0.
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


def _reply(response: Any, names: Sequence[str]) -> Reply | None:
    """A stream response as the exchange reads it; ``None`` at the stream's end."""
    if response is grpc.aio.EOF:
        return None
    if response.error_message:
        return Reply({}, error=response.error_message)
    infer = response.infer_response
    final = infer.parameters[_FINAL].bool_param if _FINAL in infer.parameters else None
    return Reply(_outputs(infer, names), final=final)


def _outputs(response: service_pb2.ModelInferResponse, names: Sequence[str]) -> dict[str, Any]:
    """The wanted outputs as arrays, read straight from the raw contents Triton sends."""
    raw = response.raw_output_contents
    if len(raw) != len(response.outputs):
        result = InferResult(response)
        arrays = {name: result.as_numpy(name) for name in names}
        return {name: array for name, array in arrays.items() if array is not None}
    return {
        tensor.name: wire_array(tensor.datatype, raw[index], tuple(tensor.shape))
        for index, tensor in enumerate(response.outputs)
        if tensor.name in names
    }


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


class GrpcCall:
    """A ``ModelStreamInfer`` call, its responses read as replies.

    grpcio cancels the whole call when a read of it is cancelled. A running ensemble request
    that is cancelled stays counted in flight in Triton 2.51 for good, so an ensemble's call is
    read ``shielded``: a cancelled reader leaves its read running, and the next read or the
    drain takes it over once the engine request was stopped. Such a call is opened with a
    deadline later than the request's, ``deadline``, at which a read raises ``TimeoutError``
    while the call stays open.
    """

    def __init__(
        self,
        call: Any,
        outputs: Sequence[str],
        *,
        shielded: bool = False,
        deadline: float | None = None,
    ) -> None:
        self._call = call
        self._outputs = outputs
        self._shielded = shielded
        self._deadline = deadline
        self._pending: asyncio.Future[Any] | None = None

    def start(self) -> None:
        """Nothing to do: grpcio sends the request once the call is opened."""

    async def read(self) -> list[Reply] | None:
        """The next reply (grpcio reads one message at a time); ``None`` at the stream's end."""
        reply = _reply(await self._next(self._deadline), self._outputs)
        return None if reply is None else [reply]

    async def drain(self, timeout_s: float = _DRAIN_S) -> bool:
        """Read to the stream's end (a call that ended, cancelled included, has none); whether
        it ended within ``timeout_s``."""
        if self._call.done():
            return True
        try:
            async with asyncio.timeout(timeout_s):
                while await self._next(None) is not grpc.aio.EOF:
                    pass
            return True
        except (TimeoutError, grpc.RpcError):
            self._call.cancel()
            return False

    def cancel(self) -> None:
        """Cancel the gRPC call."""
        self._call.cancel()

    def ended(self) -> bool:
        """Whether the call has its status (read to its end, failed or cancelled)."""
        return bool(self._call.done())

    async def _next(self, deadline: float | None) -> Any:
        if not self._shielded:
            return await self._call.read()
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._call.read())
            self._pending.add_done_callback(_retrieve)
        async with asyncio.timeout_at(deadline):
            message = await asyncio.shield(self._pending)
        self._pending = None
        return message


def _retrieve(read: asyncio.Future[Any]) -> None:
    """A read nobody awaits any more (its call was cancelled) is not reported as lost."""
    if not read.cancelled():
        read.exception()


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
