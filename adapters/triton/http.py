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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import SplitResult, urlsplit

import msgspec
import numpy as np

from adapters.triton.responses import Reply
from adapters.triton.wire import WireTensor

_JSON_TYPES = frozenset({"BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32",
                         "UINT64", "FP32", "FP64", "BYTES"})  # fmt: skip
_STATUS_NAMES = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 503: "UNAVAILABLE"}
_DRAIN_S = 1.0
SPARE_MAX_AGE_S = 2.0
_READ_BYTES = 1 << 16
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
_decoder = msgspec.json.Decoder(dict[str, Any])
_encoder = msgspec.json.Encoder()


class HttpError(Exception):
    """Triton answered the request with an HTTP error: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def status_name(self) -> str | None:
        """The gRPC status name of the same failure, for the error classifier."""
        return _STATUS_NAMES.get(self.status)


def carries(tensors: Sequence[WireTensor]) -> bool:
    """Whether JSON can carry every input: not 16-bit floats (LoRA weights), and no more than one
    dimension besides the batch (Triton's ``generate`` reads a JSON list as one dimension, so
    stop and bad word lists, ``[1, 2, N]``, cannot go that way)."""
    return all(tensor.datatype in _JSON_TYPES and tensor.ndim <= 2 for tensor in tensors)


def generate_body(request_id: str, tensors: Sequence[WireTensor], *, priority: int = 0) -> bytes:
    """A ``generate_stream`` request: each input without its batch dimension."""
    body: dict[str, Any] = {"id": request_id}
    for tensor in tensors:
        body[tensor.name] = tensor.json_value()
    if priority > 0:
        body["parameters"] = {"priority": priority}
    return _encoder.encode(body)


def reply_of(event: bytes) -> Reply:
    """One event's outputs as arrays, shaped as the gRPC responses' (batch and beam dims)."""
    data = _decoder.decode(event)
    error = data.pop("error", None)
    if error is not None:
        return Reply({}, error=str(error))
    outputs = {}
    for name, value in data.items():
        if name in ("id", "model_name", "model_version"):
            continue
        if isinstance(value, str):
            array = np.empty(1, dtype=object)
            array[0] = value.encode()
            outputs[name] = array.reshape(1, 1)
        else:
            outputs[name] = np.asarray(value).reshape(1, 1, -1)
    return Reply(outputs)


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
        self._request = _request_bytes(url, path, body, headers)
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
        if self._connection is None:
            return True
        self._draining = True
        try:
            async with asyncio.timeout(timeout_s):
                if not self._answered:
                    status, _ = await _head(self._connection[0])
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
        """Send the request now on the spare connection, where one is ready (else it is sent
        at the first read)."""
        if self._connection is not None or self._answered:
            return
        spare = self._streams.take_spare(self._url)
        if spare is not None:
            self._connection, self._spare = spare, True
            spare[1].write(self._request)

    async def _send(self) -> None:
        """Send the request (unless ``start`` did) on a new connection, or on a spare that
        Triton may have let go, and read the answer's head."""
        if self._connection is None:
            self._connection, self._spare = await self._streams.connect(self._url)
            self._connection[1].write(self._request)
        try:
            status, headers = await _head(self._connection[0])
        except (ConnectionError, asyncio.IncompleteReadError):
            if not self._spare:
                raise
            self.cancel()
            self._connection, self._spare = await self._streams.open(self._url), False
            self._connection[1].write(self._request)
            status, headers = await _head(self._connection[0])
        self._answered = True
        if status != 200:
            raise HttpError(status, await _error_text(self._connection[0], headers))

    def cancel(self) -> None:
        """Close the connection: Triton cancels the request if it is still running."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._connection is not None:
            self._streams.release(self._connection)
            self._connection = None

    async def _receive(self) -> None:
        """Send the request (at the first read), then read what Triton streams. Sending and
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


class ChunkedEvents:
    """Server-sent events out of a chunked HTTP body, whatever the pieces it arrives in."""

    def __init__(self) -> None:
        self._raw = b""
        self._text = b""
        self._events: list[bytes] = []
        self.ended = False

    def feed(self, data: bytes) -> None:
        """Add received bytes; complete chunks become events."""
        self._raw += data
        while not self.ended:
            line_end = self._raw.find(b"\r\n")
            if line_end < 0:
                return
            size = int(self._raw[:line_end].split(b";")[0], 16)
            end = line_end + 2 + size + 2
            if len(self._raw) < end:
                return
            self._text += self._raw[line_end + 2 : end - 2]
            self._raw = self._raw[end:]
            self.ended = size == 0
            *events, self._text = self._text.split(b"\n\n")
            self._events.extend(event.removeprefix(b"data: ") for event in events if event)

    def take(self) -> list[bytes]:
        """The events completed so far, each once."""
        events, self._events = self._events, []
        return events


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
        """A ``generate_stream`` call of ``model`` (sent at its first read), bounded by the
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


def _split(url: str) -> SplitResult:
    """``url`` with or without its scheme."""
    return urlsplit(url if "//" in url else f"http://{url}")


async def _dial(url: str) -> Connection:
    parts = _split(url)
    return await asyncio.open_connection(parts.hostname, parts.port or 80)


def _request_bytes(url: str, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    host = _split(url).netloc
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _error_text(reader: asyncio.StreamReader, headers: Mapping[bytes, bytes]) -> str:
    """The message of an error answer (Triton's ``{"error": "..."}``)."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        parts = []
        while size := int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16):
            parts.append((await reader.readexactly(size + 2))[:-2])
        body = b"".join(parts)
    else:
        body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
    try:
        return str(_decoder.decode(body).get("error", body.decode(errors="replace")))
    except msgspec.DecodeError:
        return body.decode(errors="replace")
