"""A local HTTP server that answers as Triton's ``generate_stream`` does, for the tests of the
HTTP transport: the request read, the head and each token's event written in chunked encoding."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from adapters.triton.http.call import HttpCall


class Handler(Protocol):
    """A server's connection handler and the URL it is served at."""

    url: str

    def handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Awaitable[None]: ...


H = TypeVar("H", bound=Handler)


@dataclass
class Peer:
    """One accepted connection: the requests it carried and whether it is closed."""

    requests: int = 0
    closed: bool = False


async def settle() -> None:
    """Lets the loop finish what the calls left: spares dialled, closes seen by the server."""
    await asyncio.sleep(0.05)


async def read_request(reader: asyncio.StreamReader) -> None:
    """Read one request: its head, then as many body bytes as its content-length says."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)


def write_stream(writer: asyncio.StreamWriter, tokens: Iterable[int], *, end: bool) -> None:
    """The answer's head and an event per token; ``end`` closes the chunked body."""
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    write_events(writer, tokens, end=end)


def write_events(writer: asyncio.StreamWriter, tokens: Iterable[int], *, end: bool) -> None:
    """An event per token, after the head; ``end`` closes the chunked body."""
    for token in tokens:
        event = b'data: {"output_ids": [%d]}\n\n' % token
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
    if end:
        writer.write(b"0\r\n\r\n")


@contextlib.asynccontextmanager
async def serving(server: H) -> AsyncIterator[H]:
    """``server`` listening on a free local port, its ``url`` set."""
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    try:
        yield server
    finally:
        listener.close()


async def tokens_of(call: HttpCall) -> list[int]:
    """Every token of a call's stream, read to its end."""
    tokens: list[int] = []
    while (replies := await call.read()) is not None:
        tokens.extend(int(reply.outputs["output_ids"].reshape(-1)[0]) for reply in replies)
    return tokens
