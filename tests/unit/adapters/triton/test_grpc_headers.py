"""The gRPC calls' HPACK header blocks: a call's headers read back by a real HPACK decoder as the
fields grpcio sends, never adding to the server's table; the server's blocks decoded as a fresh
decoder decodes them, a kept block included, after the table changed; and a call's headers and
request going out in one write, within the flow-control windows, with those of every call
opened in the same turn of the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import hpack
import pytest

from adapters.triton.grpc.h2 import H2Connection, Stream
from adapters.triton.grpc.headers import RequestHeaders, ResponseHeaders, grpc_timeout
from adapters.triton.grpc.stream import STREAM_PATH

AUTHORITY = "triton.example:8001"
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _fields(decoded: Iterable[Any]) -> list[tuple[Any, ...]]:
    return [tuple(field) for field in decoded]


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0.0, "1u"), (0.5, "500000u"), (99.999999, "99999999u"), (100.0, "100000m"),
     (599.98, "599980m"), (1e6, "1000000S")],
)  # fmt: skip
def test_the_deadline_is_sent_in_the_finest_unit_that_holds_it(
    seconds: float, expected: str
) -> None:
    assert grpc_timeout(seconds) == expected


@pytest.mark.parametrize(
    ("path", "metadata"),
    [
        (STREAM_PATH, {}),
        (STREAM_PATH, {"traceparent": TRACE}),
        ("/a/" + "p" * 300, {"X-Tenant": "t", "long": "v" * 200, "tracestate": "a=1"}),
    ],
)
def test_a_calls_headers_read_back_as_its_fields_and_leave_the_table_empty(
    path: str, metadata: dict[str, str]
) -> None:
    headers = RequestHeaders(AUTHORITY)
    decoder = hpack.Decoder()
    for timeout, sent in ((599.98, "599980m"), (2.5, "2500000u"), (599.98, "599980m")):
        fields = _fields(decoder.decode(headers.block(path, timeout, metadata)))
        assert fields == [
            (":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", AUTHORITY), ("content-type", "application/grpc"),
            ("te", "trailers"), ("grpc-timeout", sent),
            *((name.lower(), value) for name, value in metadata.items()),
        ]  # fmt: skip
        assert not decoder.header_table.dynamic_entries


def test_the_block_after_the_servers_table_size_changed_empties_this_sides_table() -> None:
    headers = RequestHeaders(AUTHORITY)
    decoder = hpack.Decoder()
    decoder.decode(headers.block(STREAM_PATH, 1.0, {}))
    headers.table_resized()
    # The server now allows no table: a block without the update would be refused.
    decoder.max_allowed_table_size = 0
    resized = headers.block(STREAM_PATH, 1.0, {})
    assert resized.startswith(b"\x20")
    assert (":path", STREAM_PATH) in _fields(decoder.decode(resized))
    assert not headers.block(STREAM_PATH, 1.0, {}).startswith(b"\x20")


def test_the_servers_blocks_decode_as_a_fresh_decoder_reads_them_after_its_table_changed() -> None:
    encoder = hpack.Encoder()
    # One entry fits: each new status evicts the last, and the same indexed byte then means
    # another status.
    encoder.header_table_size = 64
    sent = [
        [(":status", "200")],
        [("grpc-status", "0")],
        [("grpc-status", "0")],
        [("grpc-status", "13")],
        [("grpc-status", "13")],
        [("grpc-status", "0")],
        [("grpc-status", "0")],
    ]
    blocks = [encoder.encode(fields) for fields in sent]
    assert blocks[2] == blocks[4], "the same bytes, read against two different tables"
    decoded = ResponseHeaders()
    reference = hpack.Decoder()
    for block in blocks:
        assert dict(decoded.decode(block)) == dict(reference.decode(block, raw=True))


class RecordingTransport:
    """What a connection writes, one entry a write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        pass


class Receiver:
    def on_message(self, message: bytes) -> None:
        pass

    def on_end(self, failure: BaseException | None) -> None:
        pass


def _frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream id, payload) of each frame."""
    frames = []
    while data:
        length = int.from_bytes(data[:3], "big")
        kind, flags = data[3], data[4]
        frames.append((kind, flags, int.from_bytes(data[5:9], "big"), data[9 : 9 + length]))
        data = data[9 + length :]
    return frames


def _frame(kind: int, stream_id: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes((kind, 0)) + stream_id.to_bytes(4, "big") + payload
    )


HEADERS, DATA, RST_STREAM, SETTINGS, WINDOW_UPDATE = 1, 0, 3, 4, 8
END_STREAM, END_HEADERS = 0x1, 0x4


async def test_a_calls_headers_and_request_go_out_in_one_write_within_the_windows() -> None:
    transport = RecordingTransport()
    connection = H2Connection(AUTHORITY)
    connection.connection_made(transport)  # type: ignore[arg-type]
    # The server lets a stream send 100 bytes before its WINDOW_UPDATE.
    connection.data_received(_frame(SETTINGS, 0, (4).to_bytes(2, "big") + (100).to_bytes(4, "big")))
    await asyncio.sleep(0)
    message = bytes(range(256)) * 2
    transport.writes.clear()

    connection.open(STREAM_PATH, message[:50], {}, 5.0, Receiver())
    await asyncio.sleep(0)
    assert len(transport.writes) == 1
    assert [(kind, flags) for kind, flags, _, _ in _frames(transport.writes[0])] == [
        (HEADERS, END_HEADERS), (DATA, END_STREAM),
    ]  # fmt: skip

    transport.writes.clear()
    connection.open(STREAM_PATH, message, {}, 5.0, Receiver())
    await asyncio.sleep(0)
    assert len(transport.writes) == 1
    first = _frames(transport.writes[0])
    assert [(kind, flags, len(payload)) for kind, flags, _, payload in first] == [
        (HEADERS, END_HEADERS, len(first[0][3])), (DATA, 0, 100),
    ]  # fmt: skip
    transport.writes.clear()
    connection.data_received(_frame(WINDOW_UPDATE, 3, (1000).to_bytes(4, "big")))
    await asyncio.sleep(0)
    rest = _frames(transport.writes[-1])
    assert [(kind, flags, stream_id) for kind, flags, stream_id, _ in rest] == [
        (DATA, END_STREAM, 3)
    ]
    sent = first[1][3] + rest[0][3]
    assert sent == b"\0" + len(message).to_bytes(4, "big") + message


async def test_the_calls_opened_in_one_turn_of_the_loop_go_out_in_one_write_in_order() -> None:
    transport = RecordingTransport()
    connection = H2Connection(AUTHORITY)
    connection.connection_made(transport)  # type: ignore[arg-type]
    transport.writes.clear()
    first = connection.open(STREAM_PATH, b"one", {}, 5.0, Receiver())
    connection.open(STREAM_PATH, b"two", {}, 5.0, Receiver())
    first.cancel()
    assert not transport.writes
    await asyncio.sleep(0)
    assert len(transport.writes) == 1
    frames = _frames(transport.writes[0])
    assert [(kind, stream_id) for kind, _, stream_id, _ in frames] == [
        (HEADERS, 1), (DATA, 1), (HEADERS, 3), (DATA, 3), (RST_STREAM, 1),
    ]  # fmt: skip
    assert frames[3][3] == b"\0" + (3).to_bytes(4, "big") + b"two"


def test_a_call_cancelled_outside_the_loops_callbacks_has_its_reset_written() -> None:
    loop = asyncio.new_event_loop()
    try:
        transport = RecordingTransport()
        connection = H2Connection(AUTHORITY)

        async def opened() -> Stream:
            connection.connection_made(transport)  # type: ignore[arg-type]
            return connection.open(STREAM_PATH, b"one", {}, 5.0, Receiver())

        stream = loop.run_until_complete(opened())
        stream.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        written = b"".join(transport.writes).removeprefix(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        frames = _frames(written)
        assert [(kind, stream_id) for kind, _, stream_id, _ in frames] == [
            (SETTINGS, 0), (WINDOW_UPDATE, 0), (HEADERS, 1), (DATA, 1), (RST_STREAM, 1),
        ]  # fmt: skip
    finally:
        loop.close()
