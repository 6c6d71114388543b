"""The HTTP transport's spare connections, against a real local HTTP server that answers
``generate_stream`` as Triton does: every call after the first is sent on a connection opened
ahead; a spare the server closed, or an old one, is never sent on; a spare that fails before any
answer is replaced and the request sent once more; closing closes the spares too."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from adapters.triton.http import HttpStreams


@dataclass
class Peer:
    """One accepted connection: the requests it carried and whether it is still open."""

    requests: int = 0
    closed: bool = False


@dataclass
class Server:
    """A generate_stream server; ``drop_first_request_on`` lists connection numbers whose
    first request is read and dropped unanswered; ``idle_close_s`` closes a connection that
    carried nothing for that long."""

    url: str = ""
    peers: list[Peer] = field(default_factory=list)
    drop_first_request_on: set[int] = field(default_factory=set)
    idle_close_s: float | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer()
        number = len(self.peers)
        self.peers.append(peer)
        try:
            async with asyncio.timeout(self.idle_close_s):
                head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            peer.requests += 1
            if number in self.drop_first_request_on:
                return
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            for token in (5, 6):
                event = b'data: {"output_ids": [%d]}\n\n' % token
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            # Triton keeps the connection; the client closes it when the stream ends.
            await reader.read()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            peer.closed = True
            writer.close()


@contextlib.asynccontextmanager
async def serving(server: Server) -> AsyncIterator[Server]:
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        listener.close()


async def _tokens(streams: HttpStreams, url: str) -> list[int]:
    call = streams.call(url, "m", b"{}")
    tokens = []
    while (replies := await call.read()) is not None:
        tokens.extend(int(reply.outputs["output_ids"].reshape(-1)[0]) for reply in replies)
    return tokens


async def _settle() -> None:
    # Lets the loop finish opening the spare and the server see closed connections.
    await asyncio.sleep(0.05)


async def test_every_call_after_the_first_goes_out_on_a_connection_opened_ahead() -> None:
    async with serving(Server()) as server:
        streams = HttpStreams()
        for _ in range(4):
            assert await _tokens(streams, server.url) == [5, 6]
            await _settle()
        # Four calls, one connection each, and the fifth already open for the next call.
        assert [peer.requests for peer in server.peers] == [1, 1, 1, 1, 0]
        assert [peer.closed for peer in server.peers] == [True] * 4 + [False]
        assert streams.open_connections == 0
        await streams.close()
        await _settle()
        assert all(peer.closed for peer in server.peers)


async def test_a_spare_the_server_closed_is_not_sent_on() -> None:
    async with serving(Server(idle_close_s=0.05)) as server:
        streams = HttpStreams()
        assert await _tokens(streams, server.url) == [5, 6]
        await asyncio.sleep(0.2)  # the server has closed the idle spare
        assert server.peers[1].closed and server.peers[1].requests == 0
        assert await _tokens(streams, server.url) == [5, 6]
        assert [peer.requests for peer in server.peers[:3]] == [1, 0, 1]
        await streams.close()


async def test_an_old_spare_is_closed_instead_of_used() -> None:
    async with serving(Server()) as server:
        streams = HttpStreams(spare_max_age_s=0.0)
        assert await _tokens(streams, server.url) == [5, 6]
        await _settle()
        assert await _tokens(streams, server.url) == [5, 6]
        await _settle()
        assert [peer.requests for peer in server.peers[:3]] == [1, 0, 1]
        assert server.peers[1].closed
        await streams.close()


async def test_a_spare_that_fails_before_any_answer_is_replaced_and_the_request_resent() -> None:
    async with serving(Server(drop_first_request_on={1})) as server:
        streams = HttpStreams()
        assert await _tokens(streams, server.url) == [5, 6]
        await _settle()
        # The spare (connection 1) takes the request and closes without a byte.
        assert await _tokens(streams, server.url) == [5, 6]
        assert [peer.requests for peer in server.peers[:2]] == [1, 1]
        assert sum(peer.requests for peer in server.peers) == 3
        assert streams.open_connections == 0
        await streams.close()


async def test_a_fresh_connection_that_fails_is_not_resent() -> None:
    async with serving(Server(drop_first_request_on={0})) as server:
        streams = HttpStreams()
        with pytest.raises(asyncio.IncompleteReadError):
            await _tokens(streams, server.url)
        await _settle()
        assert server.peers[0].requests == 1
        assert sum(peer.requests for peer in server.peers) == 1
        await streams.close()


async def test_an_unreachable_server_fails_the_call_and_leaves_nothing_open() -> None:
    async with serving(Server()) as server:
        url = server.url
    streams = HttpStreams()
    with pytest.raises(ConnectionError):
        await _tokens(streams, url)
    await _settle()
    assert streams.open_connections == 0
    await streams.close()
