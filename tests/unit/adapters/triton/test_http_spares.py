"""The HTTP transport's spare connections, against a real local HTTP server that answers
``generate_stream`` as Triton does, with no connection kept alive (``keep_alive_s=0``; the
kept-alive ones are ``test_http_keep_alive``'s): every call after the first is sent on a
connection opened ahead; a spare the server closed, or an old one, is never sent on; a spare
that fails before any answer is replaced and the request sent once more; closing closes the
spares too."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from adapters.triton.http.call import HttpCall, HttpStreams
from tests.support.stream_server import Peer, read_request, serving, settle, tokens_of, write_stream


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
                await read_request(reader)
            peer.requests += 1
            if number in self.drop_first_request_on:
                return
            write_stream(writer, (5, 6), end=True)
            await writer.drain()
            # Triton keeps the connection; the client closes it when the stream ends.
            await reader.read()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            peer.closed = True
            writer.close()


async def test_every_call_after_the_first_goes_out_on_a_connection_opened_ahead() -> None:
    async with serving(Server()) as server:
        streams = HttpStreams(keep_alive_s=0)
        for _ in range(4):
            assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
            await settle()
        # Four calls, one connection each, and the fifth already open for the next call.
        assert [peer.requests for peer in server.peers] == [1, 1, 1, 1, 0]
        assert [peer.closed for peer in server.peers] == [True] * 4 + [False]
        assert streams.open_connections == 0
        await streams.close()
        await settle()
        assert all(peer.closed for peer in server.peers)


async def test_a_spare_the_server_closed_is_not_sent_on() -> None:
    async with serving(Server(idle_close_s=0.05)) as server:
        streams = HttpStreams(keep_alive_s=0)
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        await asyncio.sleep(0.2)  # the server has closed the idle spare
        assert server.peers[1].closed and server.peers[1].requests == 0
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        assert [peer.requests for peer in server.peers[:3]] == [1, 0, 1]
        await streams.close()


async def test_an_old_spare_is_closed_instead_of_used() -> None:
    async with serving(Server()) as server:
        streams = HttpStreams(spare_max_age_s=0.0, keep_alive_s=0)
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        await settle()
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        await settle()
        assert [peer.requests for peer in server.peers[:3]] == [1, 0, 1]
        assert server.peers[1].closed
        await streams.close()


async def test_a_spare_that_fails_before_any_answer_is_replaced_and_the_request_resent() -> None:
    async with serving(Server(drop_first_request_on={1})) as server:
        streams = HttpStreams(keep_alive_s=0)
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        await settle()
        # The spare (connection 1) takes the request and closes without a byte.
        assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
        assert [peer.requests for peer in server.peers[:2]] == [1, 1]
        assert sum(peer.requests for peer in server.peers) == 3
        assert streams.open_connections == 0
        await streams.close()


async def test_a_fresh_connection_that_fails_is_not_resent() -> None:
    async with serving(Server(drop_first_request_on={0})) as server:
        streams = HttpStreams(keep_alive_s=0)
        with pytest.raises(asyncio.IncompleteReadError):
            await tokens_of(streams.call(server.url, "m", b"{}"))
        await settle()
        assert server.peers[0].requests == 1
        assert sum(peer.requests for peer in server.peers) == 1
        await streams.close()


async def test_an_unreachable_server_fails_the_call_and_leaves_nothing_open() -> None:
    async with serving(Server()) as server:
        url = server.url
    streams = HttpStreams(keep_alive_s=0)
    with pytest.raises(ConnectionError):
        await tokens_of(streams.call(url, "m", b"{}"))
    await settle()
    assert streams.open_connections == 0
    await streams.close()


async def _requests_seen(server: Server, count: int) -> None:
    """Wait (briefly) until the server has read ``count`` requests in all."""
    async with asyncio.timeout(2.0):
        while sum(peer.requests for peer in server.peers) < count:
            await asyncio.sleep(0.01)


async def _started_after_one(server: Server, spare: bool) -> tuple[HttpStreams, HttpCall]:
    """After one call to ``server``, a second started on the spare (``spare``) or, the spare
    too old to take, on a connection dialled for it."""
    streams = HttpStreams(spare_max_age_s=2.0 if spare else 0.0, keep_alive_s=0)
    assert await tokens_of(streams.call(server.url, "m", b"{}")) == [5, 6]
    await settle()
    call = streams.call(server.url, "m", b"{}")
    call.start()
    return streams, call


@pytest.mark.parametrize("spare", [True, False], ids=["spare", "no-spare"])
async def test_a_started_call_is_sent_before_its_first_read(spare: bool) -> None:
    """``start`` sends the request at once: on the spare, or on a connection dialled for it;
    the first read then only reads the answer, and the request goes out once."""
    async with serving(Server()) as server:
        streams, call = await _started_after_one(server, spare)
        call.start()  # once only
        await _requests_seen(server, 2)
        assert await tokens_of(call) == [5, 6]
        assert sum(peer.requests for peer in server.peers) == 2
        assert server.peers[1].requests == (1 if spare else 0)
        assert streams.open_connections == 0
        await streams.close()


@pytest.mark.parametrize("spare", [True, False], ids=["spare", "no-spare"])
async def test_a_started_call_cancelled_before_any_read_closes_its_connection(spare: bool) -> None:
    """A request refused after it went ahead: closing the call closes the connection it went
    on (Triton cancels it), and a drain has nothing to wait for."""
    async with serving(Server()) as server:
        streams, call = await _started_after_one(server, spare)
        await _requests_seen(server, 2)
        call.cancel()
        assert await call.drain(0.5)
        await settle()
        carried = [peer for peer in server.peers if peer.requests]
        assert len(carried) == 2 and all(peer.closed for peer in carried)
        assert streams.open_connections == 0
        await streams.close()


async def test_a_started_call_is_drained_from_its_answer_on() -> None:
    """An ensemble's call is stopped and read to its end (``drain``) when its request is refused
    after it went ahead: the drain reads the answer's head and the stream, sending nothing."""
    async with serving(Server()) as server:
        streams = HttpStreams(spare_max_age_s=0.0, keep_alive_s=0)
        call = streams.call(server.url, "m", b"{}", keep_open=True)
        call.start()
        assert await call.drain(2.0)
        assert sum(peer.requests for peer in server.peers) == 1
        await settle()
        assert streams.open_connections == 0
        await streams.close()


async def test_a_started_call_to_an_unreachable_server_fails_at_its_read() -> None:
    async with serving(Server()) as server:
        url = server.url
    streams = HttpStreams(keep_alive_s=0)
    call = streams.call(url, "m", b"{}")
    call.start()
    with pytest.raises(ConnectionError):
        await tokens_of(call)
    assert await call.drain(0.5)
    assert streams.open_connections == 0
    await streams.close()
