"""Triton's HTTP ``generate_stream`` as a transport: one request, its responses as server-sent
events, on a connection of its own.

Measured against grpcio's asyncio client (``tests/benchmarks/transports.py``) it costs the
calling process about a third of the CPU per streamed token and per request, and Triton streams
faster over it. Closing the connection cancels the request in Triton (the engine sees
``is_cancelled``). What JSON cannot carry (LoRA weights in 16-bit floats) goes over gRPC instead.

Connections are not kept alive from one request to the next. With kept-alive connections,
Triton 2.51's HTTP frontend now and then never wrote the rest of a ``generate_stream`` request
that arrived on a connection that had served one before: the engine had sent every response and
its final one, and the stream waited until its deadline (one run in three of sixteen 256-token
streams on two cores; none in thirty such runs with a connection per request).

Opening a connection is still kept off the request's way: every server's next connection is
opened ahead, while the current request runs, and a request takes it if it is at most
``SPARE_MAX_AGE_S`` old and Triton has not closed it. A spare that fails before Triton answered
anything is replaced by a new connection and the request sent once more: a connection that
carried nothing before cannot have started a generation that Triton then dropped.

Triton's HTTP frontend hands every response to the connection's event thread through a
non-blocking socket pair (libevhtp's ``evthr_defer``) and ignores a failed hand-over: a thread
more responses behind than the socket's buffer holds loses the next ones, and streams end short
or never end. The buffer is the host's ``net.core.wmem_default`` (about 278 responses at the
usual 212,992 bytes); at 8 MiB nothing was lost, nor with the response keeper that the
supervised sidecars preload, whatever the buffer (README, "Transports to Triton";
``deploy.sidecar.frontend``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from adapters.triton.errors import HttpError
from adapters.triton.http_wire import (
    ChunkedEvents,
    error_text,
    read_head,
    reply_of,
    request_bytes,
    split_url,
)
from adapters.triton.responses import Reply

_DRAIN_S = 1.0
SPARE_MAX_AGE_S = 2.0
_READ_BYTES = 1 << 16
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class HttpCall:
    """One ``generate_stream`` request on a connection of its own.

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
        self._spare = False
        """The connection is the spare opened ahead, which Triton may have let go."""
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
                self.cancel()
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
        spare = self._streams.take_spare(self._url)
        if spare is not None:
            self._connection, self._spare = spare, True
            spare[1].write(self._request)
            return
        self._sending = asyncio.ensure_future(self._dial_and_write())
        self._sending.add_done_callback(_retrieve)

    async def _dial_and_write(self) -> None:
        connection = await self._streams.open(self._url)
        self._connection, self._spare = connection, False
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
            self._connection, self._spare = await self._streams.connect(self._url)
            self._connection[1].write(self._request)
        try:
            status, headers = await read_head(self._connection[0])
        except (ConnectionError, asyncio.IncompleteReadError):
            if not self._spare:
                raise
            self.cancel()
            self._connection, self._spare = await self._streams.open(self._url), False
            self._connection[1].write(self._request)
            status, headers = await read_head(self._connection[0])
        self._answered = True
        if status != 200:
            raise HttpError(status, await error_text(self._connection[0], headers))

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

    def ended(self) -> bool:
        """Whether the connection is closed, or was never opened."""
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


class HttpStreams:
    """The ``generate_stream`` calls to Triton servers, their open connections, and every
    server's spare connection, opened ahead for its next call."""

    def __init__(self, spare_max_age_s: float = SPARE_MAX_AGE_S) -> None:
        self._open: set[asyncio.StreamWriter] = set()
        self._spare_max_age_s = spare_max_age_s
        self._spares: dict[str, tuple[Connection, float]] = {}
        self._opening: dict[str, asyncio.Task[None]] = {}

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

    async def connect(self, url: str) -> tuple[Connection, bool]:
        """A connection to ``url`` for one call, and whether it is the spare opened ahead; the
        next spare starts opening."""
        spare = self.take_spare(url)
        if spare is not None:
            return spare, True
        return await self.open(url), False

    def take_spare(self, url: str) -> Connection | None:
        """The spare connection to ``url`` for one call, where one is ready; the next spare
        starts opening either way."""
        spare = self._take_spare(url)
        if url not in self._opening:
            task = asyncio.get_running_loop().create_task(self._open_spare(url))
            self._opening[url] = task
        if spare is not None:
            self._open.add(spare[1])
        return spare

    async def open(self, url: str) -> Connection:
        """A new connection to ``url``, counted as a call's."""
        connection = await _dial(url)
        self._open.add(connection[1])
        return connection

    def release(self, connection: Connection) -> None:
        """Close a call's connection."""
        connection[1].close()
        self._open.discard(connection[1])

    @property
    def open_connections(self) -> int:
        """Connections of calls still running (spares not counted)."""
        return len(self._open)

    async def close(self) -> None:
        """Close every connection still open, spares included."""
        for task in self._opening.values():
            task.cancel()
        await asyncio.gather(*self._opening.values(), return_exceptions=True)
        self._opening = {}
        writers = [*self._open, *(spare[1] for spare, _ in self._spares.values())]
        self._open, self._spares = set(), {}
        for writer in writers:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()

    def _take_spare(self, url: str) -> Connection | None:
        """The spare of ``url`` if it is young and Triton has not closed it (else closed)."""
        entry = self._spares.pop(url, None)
        if entry is None:
            return None
        (reader, writer), opened = entry
        age = asyncio.get_running_loop().time() - opened
        if age <= self._spare_max_age_s and not reader.at_eof() and not writer.is_closing():
            return reader, writer
        writer.close()
        return None

    async def _open_spare(self, url: str) -> None:
        try:
            connection = await _dial(url)
        except OSError:
            # The call that needs it will open its own and report what fails.
            return
        finally:
            self._opening.pop(url, None)
        # ``connect`` took any earlier spare before starting this one: there is none to replace.
        self._spares[url] = (connection, asyncio.get_running_loop().time())


def _retrieve(task: asyncio.Task[None]) -> None:
    """Retrieve a background dial's failure (the call reports it, or nobody needs it)."""
    if not task.cancelled():
        task.exception()


async def _dial(url: str) -> Connection:
    parts = split_url(url)
    return await asyncio.open_connection(parts.hostname, parts.port or 80)
