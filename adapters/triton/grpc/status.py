"""How a call's end reads as the error grpcio's asyncio API raises (``grpc.aio.AioRpcError``):
from its trailers' ``grpc-status``, a stream the server reset, or an HTTP status in place of
gRPC's."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote

import grpc  # type: ignore[import-untyped]

_STATUS = {code.value[0]: code for code in grpc.StatusCode}
_RESET_CODES = {7: grpc.StatusCode.UNAVAILABLE, 8: grpc.StatusCode.CANCELLED,
                11: grpc.StatusCode.RESOURCE_EXHAUSTED,
                12: grpc.StatusCode.PERMISSION_DENIED}  # fmt: skip
_HTTP_CODES = {400: grpc.StatusCode.INTERNAL, 401: grpc.StatusCode.UNAUTHENTICATED,
               403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.UNIMPLEMENTED,
               429: grpc.StatusCode.UNAVAILABLE, 502: grpc.StatusCode.UNAVAILABLE,
               503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.UNAVAILABLE}  # fmt: skip


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.RpcError:
    """A failed call's error, as grpcio's asyncio API raises it."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def trailers_error(trailers: Mapping[bytes, bytes], *, whole: bool) -> grpc.RpcError | None:
    """The failure the trailers tell of, ``None`` for OK. A missing status is ``UNKNOWN``; an
    OK stream whose last message came in part (``whole`` false) is ``INTERNAL``."""
    code = _STATUS.get(int(trailers.get(b"grpc-status", b"2")), grpc.StatusCode.UNKNOWN)
    if code is grpc.StatusCode.OK:
        if whole:
            return None
        code = grpc.StatusCode.INTERNAL
    return rpc_error(code, unquote(trailers.get(b"grpc-message", b"").decode(errors="replace")))


def reset_error(reason: int) -> grpc.RpcError:
    """A stream the server reset (RST_STREAM with HTTP/2 error code ``reason``)."""
    return rpc_error(
        _RESET_CODES.get(reason, grpc.StatusCode.INTERNAL), "the server reset the stream"
    )


def http_error(status: bytes) -> grpc.RpcError:
    """A response whose ``:status`` is not 200 (a proxy's answer, not the server's)."""
    code = _HTTP_CODES.get(int(status), grpc.StatusCode.UNKNOWN)
    return rpc_error(code, f"HTTP status {status.decode()}")
