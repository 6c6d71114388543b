"""Triton's HTTP ``generate_stream`` as a transport: one request, its responses as server-sent
events, on a connection it holds while it runs.

Why it exists, measured (``python -m tests.benchmarks.transports``, 2 cores, 64-token streams;
docs/results/http-client.md): at 1, 16 and 64 streams it cost the calling process 25.9, 7.2 and
7.0 µs of CPU per token, against 70.2, 38.8 and 116.0 through httpx's ``AsyncClient`` on the same
requests, and 88.1, 35.2 and 27.5 through grpcio's asyncio client; per request 1.7, 0.46 and
0.45 ms against 4.5, 2.5 and 7.4 (httpx) and 5.6, 2.3 and 1.8 (gRPC). Closing the connection
cancels the request in Triton (the engine sees ``is_cancelled``). What JSON cannot carry (LoRA
weights in 16-bit floats) goes over gRPC instead.

A connection whose stream ended cleanly (its chunked body read to the end, Triton not closing
it) is kept alive for the server's next call, as an HTTP client library's pool does: a call goes
out on the connection that served the last one, so neither side pays a connection's set-up and
tear-down per request, and Triton's HTTP frontend sees what a kept-alive client sends it. A
connection that ended any other way (cancelled, timed out, an error answer) is closed, which
cancels what still runs in Triton. Where no kept-alive connection is free, the server's next
connection has been opened ahead (the spare), and a call takes it if it is at most
``SPARE_MAX_AGE_S`` old and Triton has not closed it; a new spare then starts opening. A
connection taken ready (kept alive or spare) that fails before Triton answered anything is
replaced by a new one and the request sent once more: Triton answers a request's head before it
streams, so one that closed without a byte had not started a generation it then kept.

Triton's HTTP frontend hands every response to the connection's event thread through a
non-blocking socket pair (libevhtp's ``evthr_defer``) and ignores a failed hand-over: a thread
more responses behind than the socket's buffer holds loses the next ones, and streams end short
or never end. The buffer is the host's ``net.core.wmem_default`` (about 278 responses at the
usual 212,992 bytes); at 8 MiB nothing was lost, nor with the response keeper that the
supervised sidecars preload, whatever the buffer (docs/operations/response-keeper.md;
``deploy.sidecar.frontend``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from adapters.triton.errors import HttpError
from adapters.triton.http.pool import Connection, ConnectionPool
from adapters.triton.http.wire import (
    ChunkedEvents,
    error_text,
    read_head,
    reply_of,
    request_bytes,
)
from adapters.triton.responses import Reply

_DRAIN_S = 1.0
_READ_BYTES = 1 << 16


class HttpCall:
    """One ``generate_stream`` request on a connection it holds until its stream ends.

    ``read`` gives every reply that has arrived, at least one: when the caller fell behind (its
    client reads slowly), the replies waiting are handed over together and become one chunk,
    while a reply that could be passed on now is never held back.

    At the deadline the connection closes (Triton cancels the request), unless ``keep_open``:
    then the read waiting, or the next one, raises ``TimeoutError`` and the connection stays
    for the caller to stop the request and ``drain`` it (a cancelled running ensemble request
    stays in flight in Triton).
    """

    def __init__(self, streams: HttpStreams, url: str, path: str, body: bytes,
                 headers: Mapping[str, str], deadline: float | None,
                 keep_open: bool = False) -> None:  # fmt: skip
        self._streams = streams
        self._url = url
        self._deadline = deadline
        """Loop time after which waiting for Triton raises ``TimeoutError``."""
        self._keep_open = keep_open
        self._draining = False
        self._waiting: asyncio.Task[Any] | None = None
        """The task reading while the deadline passes, woken by it where the call stays open."""
        self._request = request_bytes(url, path, body, headers)
        self._sending: asyncio.Task[None] | None = None
        """``start``'s dialling of a new connection that the request then goes on."""
        self._connection: Connection | None = None
        self._taken_ready = False
        """The connection was taken ready (kept alive or the spare), and Triton may have let it
        go."""
        self._reusable = False
        """Triton's answer is chunked and keeps the connection open."""
        self._frames = ChunkedEvents()
        self._expiry: asyncio.TimerHandle | None = None
        self._expired = False
        self._answered = False
        """Triton's answer's head has been read."""

    async def read(self) -> list[Reply] | None:
        """The replies that arrived (at least one); ``None`` once the stream ended, its
        connection closed."""
        while True:
            events = self._frames.take()
            if events:
                return [reply_of(event) for event in events]
            if self._frames.ended:
                self._end()
                return None
            await self._receive()

    async def drain(self, timeout_s: float = _DRAIN_S) -> bool:
        """Read to the stream's end, so that closing the connection cancels nothing; whether it
        ended within ``timeout_s``. A call never sent, or closed already, has nothing to read;
        one whose reader left while waiting for Triton's answer has the answer's head read
        first."""
        if self._connection is None and self._sending is None:
            return True
        self._draining = True
        try:
            async with asyncio.timeout(timeout_s):
                if not self._answered:
                    if not await self._sent():
                        return True
                    assert self._connection is not None
                    status, _ = await read_head(self._connection[0])
                    self._answered = True
                    if status != 200:
                        # Refused: nothing runs in Triton.
                        self.cancel()
                        return True
                while await self.read() is not None:
                    pass
            return True
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
            self.cancel()
            return False

    def start(self) -> None:
        """Send the request now: on the spare connection where one is ready, else on a new one
        dialled in a task of its own (its first read waits for it). Without ``start`` the
        request is sent at the first read."""
        if self._connection is not None or self._sending is not None or self._answered:
            return
        ready = self._streams.take_ready(self._url)
        if ready is not None:
            self._connection, self._taken_ready = ready, True
            ready[1].write(self._request)
            return
        self._sending = asyncio.ensure_future(self._dial_and_write())
        self._sending.add_done_callback(_retrieve)

    async def _dial_and_write(self) -> None:
        connection = await self._streams.open(self._url)
        self._connection, self._taken_ready = connection, False
        connection[1].write(self._request)

    async def _sent(self) -> bool:
        """Wait for ``start``'s dialling, if any: whether the request is on a connection (a
        dial that failed or was cancelled sent nothing)."""
        sending, self._sending = self._sending, None
        if sending is not None:
            with contextlib.suppress(OSError):
                await sending
        return self._connection is not None

    async def _send(self) -> None:
        """Send the request (unless ``start`` did) on a new connection, or on a spare that
        Triton may have let go, and read the answer's head."""
        if self._sending is not None:
            sending, self._sending = self._sending, None
            # The dial's failure is the call's; a reader cancelled meanwhile cancels it too.
            await sending
        if self._connection is None:
            self._connection, self._taken_ready = await self._streams.connect(self._url)
            self._connection[1].write(self._request)
        try:
            status, headers = await read_head(self._connection[0])
        except (ConnectionError, asyncio.IncompleteReadError):
            if not self._taken_ready:
                raise
            self.cancel()
            self._connection, self._taken_ready = await self._streams.open(self._url), False
            self._connection[1].write(self._request)
            status, headers = await read_head(self._connection[0])
        self._answered = True
        if status != 200:
            raise HttpError(status, await error_text(self._connection[0], headers))
        self._reusable = (
            headers.get(b"transfer-encoding", b"").lower() == b"chunked"
            and headers.get(b"connection", b"").lower() != b"close"
        )

    def cancel(self) -> None:
        """Close the connection: Triton cancels the request if it is still running."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._sending is not None:
            self._sending.cancel()
            self._sending = None
        if self._connection is not None:
            self._streams.release(self._connection)
            self._connection = None

    def _end(self) -> None:
        """The stream was read to its end: its connection is kept for the server's next call
        where it can carry one, else closed."""
        connection = self._connection
        if connection is None or not (self._reusable and self._frames.whole) or self._expired:
            self.cancel()
            return
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._connection = None
        self._streams.keep(self._url, connection)

    def ended(self) -> bool:
        """Whether the connection is closed or kept for another call, or was never opened."""
        return self._connection is None and self._sending is None

    async def _receive(self) -> None:
        """Send the request (at the first read, unless ``start`` did), then read what Triton
        streams. Sending and
        the answer's head wait under the deadline; the stream's reads are bounded by one timer
        per call (a timeout armed around every read costs a timer per token)."""
        if self._expired and not self._draining:
            raise TimeoutError
        if not self._answered:
            async with asyncio.timeout_at(self._deadline):
                await self._send()
            if self._deadline is not None:
                loop = asyncio.get_running_loop()
                self._expiry = loop.call_at(self._deadline, self._expire)
        assert self._connection is not None
        if self._keep_open and not self._draining:
            data = await self._read_kept_open()
        else:
            data = await self._connection[0].read(_READ_BYTES)
        if self._expired and not self._draining:
            raise TimeoutError
        if not data:
            raise asyncio.IncompleteReadError(b"", None)
        self._frames.feed(data)

    async def _read_kept_open(self) -> bytes:
        """A read that the deadline ends with ``TimeoutError``, the connection left open (what
        arrived meanwhile stays buffered for the drain)."""
        assert self._connection is not None
        task = asyncio.current_task()
        self._waiting = task
        try:
            return await self._connection[0].read(_READ_BYTES)
        except asyncio.CancelledError:
            # Woken by the deadline alone: a timeout; cancelled by anyone else: cancelled.
            if self._expired and task is not None and task.uncancel() == 0:
                raise TimeoutError from None
            raise
        finally:
            self._waiting = None

    def _expire(self) -> None:
        """The deadline passed: the connection closes, so Triton cancels the request whether
        or not a read is waiting, and the read waiting or the next one raises
        ``TimeoutError``; where the call stays open, the read waiting is woken instead."""
        self._expiry = None
        self._expired = True
        if not self._keep_open:
            self.cancel()
        elif self._waiting is not None:
            self._waiting.cancel()


class HttpStreams(ConnectionPool):
    """The ``generate_stream`` calls to Triton servers, on the pool's connections."""

    def call(
        self,
        url: str,
        model: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        deadline: float | None = None,
        *,
        keep_open: bool = False,
    ) -> HttpCall:
        """A ``generate_stream`` call of ``model`` (sent by ``start`` or at its first read),
        bounded by the
        event loop time ``deadline`` (``HttpCall`` says what ``keep_open`` changes)."""
        path = f"/v2/models/{model}/generate_stream"
        return HttpCall(self, url, path, body, headers or {}, deadline, keep_open)


def _retrieve(task: asyncio.Task[None]) -> None:
    """Retrieve a background dial's failure (the call reports it, or nobody needs it)."""
    if not task.cancelled():
        task.exception()
