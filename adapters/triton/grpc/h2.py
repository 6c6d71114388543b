"""gRPC server-streaming calls on HTTP/2 frames read here, without grpcio's asyncio machinery.

Kept for speed: on the 2-core transports bench (``python -m tests.benchmarks.transports --levels
32 --rounds 3``: zero-compute engine, 32 streams of 64 tokens) a bare client on this module took
5.3 to 6.6 µs of CPU per streamed token, one on grpcio's asyncio API 30 to 34, one on Triton's
HTTP ``generate_stream`` 5.8 to 7.3; the backend streaming an ensemble (``--backend``) took
15.4 to 18.1 over gRPC with it (12.1 to 12.4 over HTTP) and 55 with grpcio. grpcio wakes the
event loop and resolves a future and a coroutine for every message; here one read of the socket
hands every whole message of every stream to its call.

What a call gets: one connection per server shared by every call (a new one once the server said
GOAWAY, the stream ids ran out or the connection went); the request as HEADERS (its
``grpc-timeout`` and metadata, written by ``headers.py`` without an HPACK encoder's table) and
DATA frames sent within the server's flow-control windows, written at the end of the event
loop's turn with every call opened in it (``python -m tests.benchmarks.grpc_headers``: opening
a call took 10.2 µs of CPU and two writes before, 3.4 µs and a share of one now; timed in place
at 32 clients on 2 shared cores, a write to Triton's socket cost the gateway 36 to 65 µs of CPU,
and 3,200 calls went out in 464 writes); each response message as bytes; the call's end from its
trailers, a failure raised as grpcio raises it (``grpc.aio.AioRpcError``, so the same error
mapping applies); RST_STREAM(CANCEL) for a cancelled call, which Triton takes as grpcio's
cancellation; the deadline kept here as well as by the server. Plain-text HTTP/2 with prior
knowledge only, like the insecure grpcio channel the backend opens.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Mapping
from typing import Protocol, cast

import grpc  # type: ignore[import-untyped]

from adapters.triton.grpc.headers import RequestHeaders, ResponseHeaders
from adapters.triton.grpc.status import http_error, reset_error, rpc_error, trailers_error

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = (
    0, 1, 3, 4, 6, 7, 8, 9,
)  # fmt: skip
_END_STREAM = _ACK = 0x1
_END_HEADERS, _PADDED, _PRIORITY = 0x4, 0x8, 0x20
_CANCEL = 0x8
_DEFAULT_WINDOW = 65_535
_STREAM_WINDOW = 1 << 24
"""What a stream may receive before it is given more: large enough that a stream of tokens never
needs a WINDOW_UPDATE."""
_CONNECTION_WINDOW = 1 << 30
_LAST_STREAM_ID = (1 << 31) - 1
_FRAME_HEAD = struct.Struct(">IBI")
_MESSAGE_SIZE = struct.Struct(">I")
"""The length prefix of a gRPC message (after its compression flag)."""


class Receiver(Protocol):
    """What a call is told of its stream."""

    def on_message(self, message: bytes) -> None:
        """One whole response message (without gRPC's 5-byte prefix)."""

    def on_end(self, failure: BaseException | None) -> None:
        """The stream ended: cleanly (``None``) or with the failure a read raises."""


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes((kind, flags))
        + stream_id.to_bytes(4, "big")
        + payload
    )


class Stream:
    """One call's stream on a connection."""

    def __init__(self, connection: H2Connection, stream_id: int, receiver: Receiver) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.receiver = receiver
        self.window = connection.initial_window
        self.outbox = b""
        self.sent = 0
        self.pending = bytearray()
        self.received = 0
        """Bytes of DATA received since the last WINDOW_UPDATE of this stream."""

    def cancel(self) -> None:
        """Reset the stream (Triton cancels its request); nothing more reaches the receiver."""
        self.connection.reset(self)

    def feed(self, data: memoryview) -> None:
        """Take a DATA frame's payload; hand over the whole messages in it."""
        pending, size = self.pending, len(data)
        if not pending and size >= 5 and size == 5 + _MESSAGE_SIZE.unpack_from(data, 1)[0]:
            # A streamed token's frame is most often exactly one message: no copy through
            # ``pending``.
            self.receiver.on_message(bytes(data[5:]))
            return
        pending += data
        start = 0
        while len(pending) - start >= 5:
            end = start + 5 + _MESSAGE_SIZE.unpack_from(pending, start + 1)[0]
            if end > len(pending):
                break
            self.receiver.on_message(bytes(pending[start + 5 : end]))
            start = end
        if start:
            del pending[:start]


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection to a gRPC server, carrying any number of streams."""

    def __init__(self, authority: str) -> None:
        self._transport: asyncio.Transport | None = None
        self._outgoing: list[bytes] = []
        """Frames written at the end of the event loop's turn, with every call opened in it."""
        self._buffer = bytearray()
        self._streams: dict[int, Stream] = {}
        self._blocked: dict[int, Stream] = {}
        self._next_id = 1
        self._request_headers = RequestHeaders(authority)
        self._response_headers = ResponseHeaders()
        self._block = bytearray()
        self._block_stream = 0
        self._block_ends = False
        self._window = _DEFAULT_WINDOW
        self._received = 0
        self._owed: list[Stream] = []
        """Streams that used half their window since their last WINDOW_UPDATE."""
        self.initial_window = _DEFAULT_WINDOW
        self._max_frame = 16_384
        self._max_streams = 1 << 31
        self.usable = True
        """New calls may start here: the server has not said GOAWAY, the connection is up."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not ``asyncio.Transport`` subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)
        # A call cancelled from outside a callback of the loop still has its reset written.
        self._loop = asyncio.get_running_loop()
        settings = (2).to_bytes(2, "big") + (0).to_bytes(4, "big")  # no server push
        settings += (4).to_bytes(2, "big") + _STREAM_WINDOW.to_bytes(4, "big")
        increment = (_CONNECTION_WINDOW - _DEFAULT_WINDOW).to_bytes(4, "big")
        self._transport.write(
            _PREFACE + _frame(_SETTINGS, 0, 0, settings) + _frame(_WINDOW_UPDATE, 0, 0, increment)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        self._transport = None
        self._outgoing.clear()
        streams, self._streams = list(self._streams.values()), {}
        self._blocked.clear()
        why = f"the connection ended mid-answer: {exc or 'closed by the server'}"
        for stream in streams:
            stream.receiver.on_end(rpc_error(grpc.StatusCode.UNAVAILABLE, why))

    def has_room(self) -> bool:
        """Whether a new call may start on this connection."""
        return (
            self.usable
            and len(self._streams) < self._max_streams
            and self._next_id < _LAST_STREAM_ID
        )

    def open(
        self, path: str, message: bytes, metadata: Mapping[str, str], timeout: float,
        receiver: Receiver,
    ) -> Stream:  # fmt: skip
        """Start a call: its headers, then its one request message, half-closing the stream,
        in one write where the flow-control windows let the message through (Triton reads the
        call whole, in one wake-up)."""
        assert self._transport is not None
        stream = Stream(self, self._next_id, receiver)
        self._next_id += 2
        block = self._request_headers.block(path, timeout, metadata)
        frames = []
        kind = _HEADERS
        while True:
            piece, block = block[: self._max_frame], block[self._max_frame :]
            frames.append(_frame(kind, 0 if block else _END_HEADERS, stream.stream_id, piece))
            kind = _CONTINUATION
            if not block:
                break
        stream.outbox = b"\0" + len(message).to_bytes(4, "big") + message
        self._streams[stream.stream_id] = stream
        self._send(stream, frames)
        self._write(b"".join(frames))
        return stream

    def reset(self, stream: Stream) -> None:
        """Cancel a stream still open here."""
        if self._streams.pop(stream.stream_id, None) is None:
            return
        self._blocked.pop(stream.stream_id, None)
        self._write(_frame(_RST_STREAM, 0, stream.stream_id, _CANCEL.to_bytes(4, "big")))
        self._close_if_idle()

    def retire(self) -> None:
        """Take no new calls; close once the open ones ended."""
        self.usable = False
        self._close_if_idle()

    def close(self) -> None:
        """Close the connection; its calls end as ``UNAVAILABLE``."""
        self.usable = False
        if self._transport is not None:
            self._flush()
            self._transport.close()

    def _send(self, stream: Stream, frames: list[bytes]) -> None:
        """Add to ``frames`` what the windows let through of a stream's request; the rest waits
        for a WINDOW_UPDATE."""
        total = len(stream.outbox)
        while stream.sent < total:
            size = min(total - stream.sent, self._window, stream.window, self._max_frame)
            if size <= 0:
                self._blocked[stream.stream_id] = stream
                return
            end = stream.sent + size
            flags = _END_STREAM if end == total else 0
            frames.append(_frame(_DATA, flags, stream.stream_id, stream.outbox[stream.sent : end]))
            stream.sent = end
            self._window -= size
            stream.window -= size
        stream.outbox = b""
        self._blocked.pop(stream.stream_id, None)

    def _unblock(self) -> None:
        if not self._blocked or self._transport is None:
            return
        frames: list[bytes] = []
        for stream in list(self._blocked.values()):
            self._send(stream, frames)
        if frames:
            self._write(b"".join(frames))

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        view = memoryview(buffer)
        start, size = 0, len(buffer)
        try:
            while size - start >= 9:
                # The 3-byte length and the type as one big-endian word, the flags, the stream.
                head, flags, stream_id = _FRAME_HEAD.unpack_from(buffer, start)
                end = start + 9 + (head >> 8)
                if end > size:
                    break
                kind, stream_id = head & 0xFF, stream_id & _LAST_STREAM_ID
                if kind == _DATA:  # a streamed token's frame: no dispatch
                    self._on_data(flags, stream_id, view[start + 9 : end])
                else:
                    self._on_frame(kind, flags, stream_id, view[start + 9 : end])
                start = end
        finally:
            view.release()
        del buffer[:start]
        self._give_back()

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if kind == _DATA:
            self._on_data(flags, stream_id, payload)
        elif kind in (_HEADERS, _CONTINUATION):
            self._on_headers(kind, flags, stream_id, payload)
        elif kind == _RST_STREAM:
            stream = self._forget(stream_id)
            if stream is not None:
                stream.receiver.on_end(reset_error(int.from_bytes(payload[:4], "big")))
        elif kind == _SETTINGS and not flags & _ACK:
            self._on_settings(payload)
        elif kind == _PING and not flags & _ACK:
            self._write(_frame(_PING, _ACK, 0, bytes(payload)))
        elif kind == _GOAWAY:
            self._on_goaway(int.from_bytes(payload[:4], "big") & _LAST_STREAM_ID)
        elif kind == _WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & _LAST_STREAM_ID
            if stream_id == 0:
                self._window += increment
            elif (stream := self._streams.get(stream_id)) is not None:
                stream.window += increment
            self._unblock()

    def _on_data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        self._received += len(payload)
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        stream.received += len(payload)
        if stream.received >= _STREAM_WINDOW // 2:
            self._owed.append(stream)
        if flags & _PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        stream.feed(payload)
        if flags & _END_STREAM and self._forget(stream_id) is not None:
            stream.receiver.on_end(rpc_error(grpc.StatusCode.INTERNAL, "the stream ended "
                                             "without its status"))  # fmt: skip

    def _on_headers(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if kind == _HEADERS:
            if flags & _PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & _PRIORITY:
                payload = payload[5:]
            self._block = bytearray(payload)
            self._block_stream = stream_id
            self._block_ends = bool(flags & _END_STREAM)
        else:
            self._block += payload
        if not flags & _END_HEADERS:
            return
        # Every block is decoded, a forgotten stream's too: HPACK's table is the connection's.
        headers = self._response_headers.decode(bytes(self._block))
        stream = self._streams.get(self._block_stream)
        if stream is None:
            return
        status = headers.get(b":status")
        if status is not None and status != b"200":
            self._forget(stream.stream_id)
            stream.receiver.on_end(http_error(status))
            return
        if self._block_ends or b"grpc-status" in headers:
            self._end(stream, headers)

    def _end(self, stream: Stream, trailers: Mapping[bytes, bytes]) -> None:
        """The stream's trailers: its status, and where that is not OK the message."""
        self._forget(stream.stream_id)
        if stream.sent < len(stream.outbox):
            # The server answered before the whole request arrived: the rest is not sent.
            self._write(_frame(_RST_STREAM, 0, stream.stream_id, _CANCEL.to_bytes(4, "big")))
        stream.receiver.on_end(trailers_error(trailers, whole=not stream.pending))

    def _on_settings(self, payload: memoryview) -> None:
        for offset in range(0, len(payload) - 5, 6):
            name = int.from_bytes(payload[offset : offset + 2], "big")
            value = int.from_bytes(payload[offset + 2 : offset + 6], "big")
            if name == 1:
                self._request_headers.table_resized()
            elif name == 3:
                self._max_streams = value
            elif name == 4:
                for stream in self._streams.values():
                    stream.window += value - self.initial_window
                self.initial_window = value
            elif name == 5:
                self._max_frame = value
        self._write(_frame(_SETTINGS, _ACK, 0))
        self._unblock()

    def _on_goaway(self, last_stream_id: int) -> None:
        """The server takes no new streams: those it will not answer end as ``UNAVAILABLE``."""
        self.usable = False
        for stream_id in [sid for sid in self._streams if sid > last_stream_id]:
            stream = self._forget(stream_id)
            if stream is not None:
                stream.receiver.on_end(
                    rpc_error(grpc.StatusCode.UNAVAILABLE, "the server is going away")
                )
        self._close_if_idle()

    def _forget(self, stream_id: int) -> Stream | None:
        self._blocked.pop(stream_id, None)
        return self._streams.pop(stream_id, None)

    def _close_if_idle(self) -> None:
        if not self.usable and not self._streams and self._transport is not None:
            self._flush()
            self._transport.close()

    def _give_back(self) -> None:
        """WINDOW_UPDATEs for what was read, once half a window is used (rarely, for tokens)."""
        if self._transport is None or (not self._owed and self._received < _CONNECTION_WINDOW // 2):
            return
        updates = []
        if self._received >= _CONNECTION_WINDOW // 2:
            updates.append(_frame(_WINDOW_UPDATE, 0, 0, self._received.to_bytes(4, "big")))
            self._received = 0
        owed, self._owed = self._owed, []
        for stream in owed:
            if stream.received and stream.stream_id in self._streams:
                increment = stream.received.to_bytes(4, "big")
                updates.append(_frame(_WINDOW_UPDATE, 0, stream.stream_id, increment))
                stream.received = 0
        if updates:
            self._write(b"".join(updates))

    def _write(self, data: bytes) -> None:
        """Write ``data`` at the end of the event loop's turn, after what was written before it
        in the turn: the calls a turn opens reach Triton in one socket write."""
        if self._transport is None:
            return
        if not self._outgoing:
            self._loop.call_soon(self._flush)
        self._outgoing.append(data)

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        if outgoing and self._transport is not None:
            self._transport.write(b"".join(outgoing))
