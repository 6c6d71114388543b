"""How a gRPC call's end reads as grpcio's error: trailers, reset streams, HTTP statuses."""

from __future__ import annotations

import grpc  # type: ignore[import-untyped]
import pytest

from adapters.triton.grpc.status import http_error, reset_error, trailers_error


@pytest.mark.parametrize(
    ("trailers", "whole", "code", "details"),
    [
        ({b"grpc-status": b"0"}, True, None, None),
        ({b"grpc-status": b"0"}, False, grpc.StatusCode.INTERNAL, ""),
        ({}, True, grpc.StatusCode.UNKNOWN, ""),
        ({b"grpc-status": b"99"}, True, grpc.StatusCode.UNKNOWN, ""),
        (
            {b"grpc-status": b"3", b"grpc-message": b"unexpected%20input%3A%20x"},
            True,
            grpc.StatusCode.INVALID_ARGUMENT,
            "unexpected input: x",
        ),
        (
            {b"grpc-status": b"14", b"grpc-message": b"\xff"},
            True,
            grpc.StatusCode.UNAVAILABLE,
            "\ufffd",
        ),
    ],
)
def test_trailers(
    trailers: dict[bytes, bytes], whole: bool, code: grpc.StatusCode | None, details: str | None
) -> None:
    error = trailers_error(trailers, whole=whole)
    if code is None:
        assert error is None
    else:
        assert isinstance(error, grpc.aio.AioRpcError)
        assert (error.code(), error.details()) == (code, details)


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        (7, grpc.StatusCode.UNAVAILABLE),
        (8, grpc.StatusCode.CANCELLED),
        (11, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (2, grpc.StatusCode.INTERNAL),
    ],
)
def test_a_reset_stream(reason: int, code: grpc.StatusCode) -> None:
    error = reset_error(reason)
    assert (error.code(), error.details()) == (code, "the server reset the stream")


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (b"401", grpc.StatusCode.UNAUTHENTICATED),
        (b"404", grpc.StatusCode.UNIMPLEMENTED),
        (b"503", grpc.StatusCode.UNAVAILABLE),
        (b"418", grpc.StatusCode.UNKNOWN),
    ],
)
def test_an_http_status_in_place_of_grpcs(status: bytes, code: grpc.StatusCode) -> None:
    error = http_error(status)
    assert (error.code(), error.details()) == (code, f"HTTP status {status.decode()}")
