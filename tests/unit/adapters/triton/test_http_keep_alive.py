"""The HTTP transport's kept-alive connections, against a real local HTTP server that answers
``generate_stream`` as Triton does, several requests a connection: a call that ends cleanly
leaves its connection for the next call; concurrent calls each take their own; a connection
whose call was cancelled, answered with an error, or closed by the server is never sent on
again; one that fails before any answer is replaced and the request sent once more; an idle one
too old is closed; closing closes them all."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from adapters.triton.errors import HttpError
from adapters.triton.http.call import HttpStreams
from tests.support.stream_server import Peer, read_request, serving, settle, tokens_of, write_stream


@dataclass
class Server:
    """A generate_stream server keeping its connections alive. The n-th request over all
    connections is answered by ``actions[n]`` (default ``answer``): ``answer`` streams two
    tokens and ends; ``drop`` closes the connection without a byte; ``stall`` streams one
    token and waits for the client to close; ``error`` answers 400; ``close`` answers and
    closes the connection after it."""

    actions: dict[int, str] = field(default_factory=dict)
    url: str = ""
    peers: list[Peer] = field(default_factory=list)
    served: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer()
        self.peers.append(peer)
        try:
            while True:
                await read_request(reader)
                peer.requests += 1
                action = self.actions.get(self.served, "answer")
                self.served += 1
                if action == "drop":
                    return
                if action == "stall":
                    write_stream(writer, (7,), end=False)
                    await writer.drain()
                    await reader.read()
                    return
                if action == "error":
                    body = b'{"error":"bad input"}'
                    writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(body), body))  # fmt: skip
                    await writer.drain()
                    continue
                write_stream(writer, (5, 6), end=True)
                await writer.drain()
                if action == "close":
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            peer.closed = True
            writer.close()


def _carried(server: Server) -> list[int]:
    """Requests per connection, those that carried any."""
    return [peer.requests for peer in server.peers if peer.requests]


async def test_calls_one_after_another_go_on_one_kept_alive_connection() -> None:
    async with serving(Server()) as server:
        streams = HttpStreams()
        for _ in range(4):
            assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
            assert streams.open_connections == 0 and streams.idle_connections == 1
        await settle()
        assert _carried(server) == [4]
        # The spare opened while the first call dialled its own is still unused.
        assert len(server.peers) == 2
        await streams.close()
        await settle()
        assert all(peer.closed for peer in server.peers)
        assert streams.idle_connections == 0


async def test_concurrent_calls_each_take_a_connection_and_leave_it_for_later_ones() -> None:
    async with serving(Server()) as server:
        streams = HttpStreams()
        for _ in range(3):
            calls = [streams.call(server.url, "m", b"{}") for _ in range(3)]
            for call in calls:
                call.start()
            assert await asyncio.gather(*(tokens_of(call) for call in calls)) == [[5, 6]] * 3
            await settle()
        # Three connections (the spare one of them) carried the nine requests.
        assert sorted(_carried(server)) == [3, 3, 3]
        assert streams.idle_connections == 3
        await streams.close()


async def test_a_cancelled_call_closes_its_connection_and_the_next_call_goes_elsewhere() -> None:
    async with serving(Server(actions={1: "stall"})) as server:
        streams = HttpStreams()
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        stalled = streams.call(server.url, "m", b"{}")
        assert len(await stalled.read() or []) == 1
        stalled.cancel()  # Triton cancels a request whose connection closes
        await settle()
        assert server.peers[0].closed and server.peers[0].requests == 2
        assert streams.idle_connections == 0
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        assert _carried(server) == [2, 1]
        await streams.close()


async def test_an_error_answer_closes_its_connection() -> None:
    async with serving(Server(actions={1: "error"})) as server:
        streams = HttpStreams()
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        call = streams.call(server.url, "m", b"{}")
        with pytest.raises(HttpError, match="bad input"):
            await tokens_of(call)
        call.cancel()
        await settle()
        assert server.peers[0].closed
        assert streams.open_connections == 0 and streams.idle_connections == 0
        await streams.close()


async def test_a_connection_the_server_closed_after_its_answer_is_not_sent_on() -> None:
    async with serving(Server(actions={0: "close"})) as server:
        streams = HttpStreams()
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        await settle()
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        assert _carried(server) == [1, 1]
        assert server.served == 2
        await streams.close()


async def test_a_kept_connection_that_fails_before_any_answer_is_replaced_and_resent() -> None:
    """The server takes the second request on the kept connection and closes it unanswered
    (as a server that let an idle connection go would): the request goes again on another."""
    async with serving(Server(actions={1: "drop"})) as server:
        streams = HttpStreams()
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        assert server.served == 3
        assert server.peers[0].closed and server.peers[0].requests == 2
        assert streams.open_connections == 0 and streams.idle_connections == 1
        await streams.close()


async def test_an_idle_connection_too_old_is_closed_instead_of_used() -> None:
    async with serving(Server()) as server:
        streams = HttpStreams(keep_alive_s=0.05)
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        await settle()
        await asyncio.sleep(0.1)
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        await settle()
        assert server.peers[0].closed and server.peers[0].requests == 1
        assert _carried(server) == [1, 1]  # the second on the spare
        await streams.close()


async def test_without_keep_alive_every_connection_carries_one_call() -> None:
    async with serving(Server()) as server:
        streams = HttpStreams(keep_alive_s=0)
        for _ in range(3):
            assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
            await settle()
        assert _carried(server) == [1, 1, 1]
        assert streams.idle_connections == 0
        await streams.close()
