"""HTTP plumbing of the completion routes: body decoding, disconnect races, SSE responses."""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import msgspec
from litestar.types import Message, Receive, Scope, Send

from gateway.errors import (
    ClientDisconnected,
    ErrorEnvelope,
    InternalServerError,
    InvalidRequestError,
    body_too_large,
    from_decode_error,
    to_api_error,
)
from gateway.http import sse

logger = logging.getLogger(__name__)
T = TypeVar("T")
S = TypeVar("S")
_encoder = msgspec.json.Encoder()
_LEFT = "the client disconnected before the answer was ready"


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


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request's body; a 413 as soon as it announces or sends more than ``limit`` bytes."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise body_too_large()
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected(_LEFT)
        part: bytes = message.get("body", b"")  # type: ignore[assignment]
        size += len(part)
        if size > limit:
            raise body_too_large()
        parts.append(part)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it when the client disconnects first (vLLM's pattern).

    ``work`` runs in the calling task. Its first step runs at once: work that never waits
    (templating a short prompt) is done then, with no watcher and no extra turn of the event
    loop. Work that waits goes on under a watcher task reading ``receive``, which cancels the
    calling task if the client leaves.
    """
    steps = work.__await__()
    try:
        first = steps.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    task = asyncio.current_task()
    assert task is not None
    left = False
    settled = False

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        nonlocal left
        if not settled and not watcher.cancelled() and watcher.exception() is None:
            left = True
            task.cancel()

    watcher = asyncio.ensure_future(_disconnected(receive))
    watcher.add_done_callback(on_disconnect)
    try:
        result: T = await _resumed(steps, first)
    except asyncio.CancelledError:
        if not left:
            raise
        task.uncancel()
        raise ClientDisconnected(_LEFT) from None
    finally:
        # Set before any other await: a disconnect noticed from here on cancels nothing.
        settled = True
        watcher.remove_done_callback(on_disconnect)
        watcher.cancel()
    if left:
        # The work swallowed the cancellation; the client is gone all the same.
        task.uncancel()
        raise ClientDisconnected(_LEFT)
    return result


@types.coroutine
def _resumed(steps: Generator[Any, Any, T], yielded: Any) -> Generator[Any, Any, T]:
    """The rest of an awaitable whose first step already ran and yielded ``yielded``: what
    ``yield from`` does, from its second step on (each value the task sends or throws goes to
    the awaitable, each value it yields to the task)."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            steps.close()
            raise
        except BaseException as exc:
            try:
                yielded = steps.throw(exc)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
        else:
            try:
                yielded = steps.send(sent)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]


def _raw_headers(headers: Mapping[str, str], content_type: bytes) -> list[tuple[bytes, bytes]]:
    encoded = [(b"content-type", content_type)]
    for name, value in headers.items():
        encoded.append((name.lower().encode("latin-1"), value.encode("latin-1")))
    return encoded


def _chunk(body: bytes) -> Message:
    return {"type": "http.response.body", "body": body, "more_body": True}


class JsonAnswer:
    """A whole JSON answer (status 200) as a bare ASGI app."""

    __slots__ = ("_body", "_headers")

    def __init__(self, payload: msgspec.Struct, headers: Mapping[str, str]) -> None:
        self._body = _encoder.encode(payload)
        self._headers = _raw_headers(headers, b"application/json")
        self._headers.append((b"content-length", str(len(self._body)).encode()))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self._headers})
        await send({"type": "http.response.body", "body": self._body, "more_body": False})


class EventStream:
    """An SSE answer as a bare ASGI app: each batch of payloads framed and sent in one write as
    it comes, ``[DONE]`` last.

    A failure mid-stream becomes an in-band error event. A client that disconnects (seen by a
    watcher on ``receive``) cancels the writing; the payloads are closed, which cancels the
    generation, and the app returns quietly.
    """

    __slots__ = ("_error_body", "_first", "_headers", "_on_close", "_rest")

    def __init__(
        self,
        first: Sequence[msgspec.Struct],
        rest: AsyncGenerator[Sequence[msgspec.Struct], None],
        error_body: Callable[[Exception], ErrorEnvelope],
        headers: Mapping[str, str],
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._first = first
        self._rest = rest
        self._error_body = error_body
        self._on_close = on_close
        self._headers = _raw_headers({**sse.HEADERS, **headers}, sse.CONTENT_TYPE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        left = False

        def on_disconnect(watcher: asyncio.Future[None]) -> None:
            nonlocal left
            if not watcher.cancelled() and watcher.exception() is None:
                left = True
                task.cancel()

        watcher = asyncio.ensure_future(_disconnected(receive))
        watcher.add_done_callback(on_disconnect)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self._headers})
            await self._send_events(send)
            watcher.remove_done_callback(on_disconnect)
            await send({"type": "http.response.body", "body": sse.DONE, "more_body": False})
        except asyncio.CancelledError:
            if not left:
                raise
            task.uncancel()
            logger.info("client disconnected mid-stream; generation cancelled")
        finally:
            watcher.remove_done_callback(on_disconnect)
            watcher.cancel()
            try:
                await self._rest.aclose()
            finally:
                if self._on_close is not None:
                    await self._on_close()

    async def _send_events(self, send: Send) -> None:
        frame = sse.frame
        try:
            await send(_chunk(b"".join(map(frame, self._first))))
            async for batch in self._rest:
                await send(_chunk(b"".join(map(frame, batch))))
        except Exception as exc:
            await send(_chunk(frame(self._error_body(exc))))


async def stream_response(
    receive: Receive,
    chunks: AsyncGenerator[Sequence[msgspec.Struct], None],
    *,
    retry_after_s: int,
    headers: Mapping[str, str] | None = None,
    on_close: Callable[[], Awaitable[None]] | None = None,
) -> EventStream:
    """An SSE answer whose first chunks are already produced; ``on_close`` runs when it ends.

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

    return EventStream(first, chunks, error_body, headers or {}, on_close)
