"""HTTP plumbing of the completion routes: body decoding, disconnect races, SSE responses."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable
from contextlib import aclosing
from typing import TypeVar

import anyio
import msgspec
from litestar.response import Stream
from litestar.types import Receive

from gateway import sse
from gateway.errors import (
    ClientDisconnected,
    InternalServerError,
    InvalidRequestError,
    from_decode_error,
    to_api_error,
)
from gateway.protocol import ErrorEnvelope

logger = logging.getLogger(__name__)
T = TypeVar("T")
S = TypeVar("S")


def decode_body(body: bytes, schema: type[S]) -> S:
    """Decode a JSON request body; malformed JSON and wrong types become 400s naming the field."""
    try:
        return msgspec.json.decode(body, type=schema)
    except msgspec.DecodeError as exc:
        raise from_decode_error(exc) from None
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(
            f"The request body is not valid UTF-8 (byte {exc.start}); JSON must be UTF-8."
        ) from None
    except RecursionError:
        raise InvalidRequestError(
            "The JSON body of your request is nested too deeply to parse."
        ) from None


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it when the client disconnects first (vLLM's pattern)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected("the client disconnected before the answer was ready")
    return task.result()


async def _prepend(
    first: msgspec.Struct, rest: AsyncGenerator[msgspec.Struct, None]
) -> AsyncGenerator[msgspec.Struct, None]:
    yield first
    async with aclosing(rest):
        async for item in rest:
            yield item


async def stream_response(
    receive: Receive,
    chunks: AsyncGenerator[msgspec.Struct, None],
    *,
    retry_after_s: int,
    headers: dict[str, str] | None = None,
) -> Stream:
    """An SSE response whose first chunk is already produced.

    Waiting for the first chunk before answering lets failures that happen before any output
    (Triton down, a rejected request) get their proper HTTP status instead of an in-band error.
    """
    try:
        first = await until_disconnect(receive, anext(chunks, None))
    except BaseException:
        with anyio.CancelScope(shield=True):
            await chunks.aclose()
        raise
    if first is None:
        raise InternalServerError("The model produced no output.")

    def error_body(exc: Exception) -> ErrorEnvelope:
        return to_api_error(exc, retry_after_s=retry_after_s).envelope()

    body = sse.event_stream(_prepend(first, chunks), error_body)
    return Stream(body, media_type=sse.MEDIA_TYPE, headers={**sse.HEADERS, **(headers or {})})
