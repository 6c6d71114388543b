"""What a gRPC call's HTTP/2 headers cost the gateway: hpack's encoder and decoder against the
blocks of ``adapters/triton/grpc/headers.py``, and the writes that open a call.

No server: the response blocks are those Triton's gRPC frontend sends a connection's calls (the
same indexed response headers and trailers after the first call), encoded here by hpack's
encoder as a server's HPACK encoder indexes them. Printed: CPU µs per call (the best of
``--rounds``) and the socket writes that open one call and 32 calls opened in one turn of the
event loop (a write to Triton's socket cost the gateway 37 to 65 µs of CPU at 32 clients on 2
shared cores, ``H2Connection.open`` timed in place). ``python -m
tests.benchmarks.grpc_headers``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

import hpack

from adapters.triton.grpc.h2 import H2Connection
from adapters.triton.grpc.headers import RequestHeaders, ResponseHeaders, grpc_timeout
from adapters.triton.grpc.stream import STREAM_PATH

AUTHORITY = "127.0.0.1:8001"
TIMEOUT_S = 599.98


def per_call(work: Callable[[], Any], calls: int, rounds: int) -> float:
    """CPU µs a call of ``work``, the quietest of ``rounds``."""
    work()
    taken = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(calls):
            work()
        taken.append(1e6 * (time.process_time() - start) / calls)
    return min(taken)


def hpack_request(encoder: hpack.Encoder) -> Callable[[], bytes]:
    """A call's headers as hpack's encoder writes them (indexing each new field)."""

    def encode() -> bytes:
        return encoder.encode(
            [(":method", "POST"), (":scheme", "http"), (":path", STREAM_PATH),
             (":authority", AUTHORITY), ("content-type", "application/grpc"),
             ("te", "trailers"), ("grpc-timeout", grpc_timeout(TIMEOUT_S))]
        )  # fmt: skip

    return encode


def response_blocks() -> list[bytes]:
    """A connection's first call's response headers and trailers, then a later call's."""
    server = hpack.Encoder()
    fields = ([(":status", "200"), ("content-type", "application/grpc")], [("grpc-status", "0")])
    return [server.encode(block) for _ in range(2) for block in fields]


class CountingTransport:
    """Counts a connection's writes."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def close(self) -> None:
        pass


class Receiver:
    def on_message(self, message: bytes) -> None:
        pass

    def on_end(self, failure: BaseException | None) -> None:
        pass


def open_call(connection: H2Connection, message: bytes) -> Callable[[], None]:
    """A call opened and forgotten, the connection's window kept open."""
    receiver = Receiver()

    def opened() -> None:
        stream = connection.open(STREAM_PATH, message, {}, TIMEOUT_S, receiver)
        connection.reset(stream)

    return opened


async def opening(calls: int, rounds: int) -> tuple[float, int, int]:
    """CPU µs to open a call (its frames queued for the turn's write), and the socket writes
    that one call opened alone and 32 calls opened in one turn take."""
    transport = CountingTransport()
    connection = H2Connection(AUTHORITY)
    connection.connection_made(transport)  # type: ignore[arg-type]
    # The window a server gives: a connection's requests never wait for it here.
    increment = (1 << 30).to_bytes(4, "big")
    connection.data_received((4).to_bytes(3, "big") + bytes((8, 0)) + bytes(4) + increment)
    cpu = per_call(open_call(connection, b"x" * 300), calls, rounds)
    await asyncio.sleep(0)
    receiver = Receiver()
    counts = []
    for batch in (1, 32):
        transport.writes = 0
        for _ in range(batch):
            connection.open(STREAM_PATH, b"x" * 300, {}, TIMEOUT_S, receiver)
        await asyncio.sleep(0)
        counts.append(transport.writes)
    return cpu, counts[0], counts[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls a round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the quietest is printed")
    args = parser.parse_args(argv)
    calls, rounds = args.calls, args.rounds
    blocks = response_blocks()
    hpack_decoder = hpack.Decoder()
    for block in blocks[:2]:
        hpack_decoder.decode(block, raw=True)
    kept = ResponseHeaders()
    for block in blocks[:2]:
        kept.decode(block)
    headers = RequestHeaders(AUTHORITY)
    rows = [
        ("request headers, hpack encoder", per_call(hpack_request(hpack.Encoder()), calls, rounds)),
        ("request headers, RequestHeaders", per_call(
            lambda: headers.block(STREAM_PATH, TIMEOUT_S, {}), calls, rounds)),
        ("response headers and trailers, hpack decoder", per_call(
            lambda: [hpack_decoder.decode(block, raw=True) for block in blocks[2:]], calls,
            rounds)),
        ("response headers and trailers, ResponseHeaders", per_call(
            lambda: [kept.decode(block) for block in blocks[2:]], calls, rounds)),
    ]  # fmt: skip
    cpu, alone, batched = asyncio.run(opening(calls, rounds))
    rows.append(("a call opened (H2Connection.open)", cpu))
    for name, figure in rows:
        print(f"{name:48} {figure:6.2f} µs a call")
    print(f"{'socket writes: a call opened alone':48} {alone:6d}")
    print(f"{'socket writes: 32 calls opened in one turn':48} {batched:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
