"""The HTTP transport's deadline, against a real local HTTP server that answers
``generate_stream`` with one event and then stalls: a read waiting past the deadline raises
``TimeoutError`` and the connection closes at the deadline (Triton cancels the request when its
connection closes), also while nobody reads; a stream that ends in time is not cut; a call kept
open past its deadline (an ensemble's) raises there and drains what comes later."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest

from adapters.triton.http.call import HttpStreams
from tests.support.stream_server import (
    read_request,
    serving,
    tokens_of,
    write_events,
    write_stream,
)


@dataclass
class StallingServer:
    """Answers the head and ``events`` events, then writes nothing more until the client closes
    (``end`` ends the stream instead, ``late_s`` later two more events and the end); records
    when each connection closed."""

    events: int = 1
    end: bool = False
    head_delay_s: float = 0.0
    late_s: float | None = None
    url: str = ""
    closed_at: list[float] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await read_request(reader)
            await asyncio.sleep(self.head_delay_s)
            write_stream(writer, range(self.events), end=self.end)
            await writer.drain()
            if self.late_s is not None:
                await asyncio.sleep(self.late_s)
                write_events(writer, (self.events, self.events + 1), end=True)
                await writer.drain()
            await reader.read()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed_at.append(time.monotonic())
            writer.close()


SLACK_S = 1.5
"""How late past a 0.2 to 0.3 s deadline a loaded machine may still see it fire; the server
stalls for good (or until this long) otherwise."""


def _deadline(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def _closed(server: StallingServer) -> float:
    """When the server saw its one connection close (failing if it stays open)."""
    for _ in range(int(2 * SLACK_S / 0.01)):
        if server.closed_at:
            assert len(server.closed_at) == 1
            return server.closed_at[0]
        await asyncio.sleep(0.01)
    raise AssertionError("the connection stayed open past its deadline")


async def test_a_read_waiting_past_the_deadline_times_out_and_the_connection_closes() -> None:
    async with serving(StallingServer()) as server:
        streams = HttpStreams()
        call = streams.call(server.url, "m", b"{}", deadline=_deadline(0.3))
        started = time.monotonic()
        assert len(await call.read() or []) == 1
        with pytest.raises(TimeoutError):
            await call.read()
        waited = time.monotonic() - started
        assert 0.25 <= waited < SLACK_S
        assert await _closed(server) - started < SLACK_S
        assert streams.open_connections == 0
        await streams.close()


async def test_the_connection_closes_at_the_deadline_while_nobody_reads() -> None:
    async with serving(StallingServer()) as server:
        streams = HttpStreams()
        call = streams.call(server.url, "m", b"{}", deadline=_deadline(0.2))
        started = time.monotonic()
        assert len(await call.read() or []) == 1
        # The consumer is busy elsewhere past the deadline: Triton still sees the request go.
        assert 0.15 <= await _closed(server) - started < SLACK_S
        with pytest.raises(TimeoutError):
            await call.read()
        await streams.close()


async def test_a_head_that_comes_too_late_times_out() -> None:
    async with serving(StallingServer(head_delay_s=2 * SLACK_S)) as server:
        streams = HttpStreams()
        call = streams.call(server.url, "m", b"{}", deadline=_deadline(0.2))
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await call.read()
        assert time.monotonic() - started < SLACK_S
        await streams.close()


async def test_a_stream_that_ends_in_time_is_read_to_its_end_and_nothing_fires_later() -> None:
    async with serving(StallingServer(events=3, end=True)) as server:
        streams = HttpStreams()
        call = streams.call(server.url, "m", b"{}", deadline=_deadline(0.2))
        assert await tokens_of(call) == [0, 1, 2]
        await asyncio.sleep(0.3)  # past the deadline: the ended call's timer is gone
        assert await call.read() is None
        await streams.close()


@pytest.mark.parametrize("reading", [True, False])
async def test_a_call_kept_open_times_out_at_its_deadline_and_drains_to_its_end(
    reading: bool,
) -> None:
    """An ensemble's call: past the deadline a read raises, the connection stays open (closing
    it would leave Triton counting the request), and the drain reads the rest."""
    async with serving(StallingServer(late_s=SLACK_S)) as server:
        streams = HttpStreams()
        call = streams.call(server.url, "m", b"{}", deadline=_deadline(0.2), keep_open=True)
        started = time.monotonic()
        assert len(await call.read() or []) == 1
        if not reading:
            await asyncio.sleep(0.3)  # busy elsewhere while the deadline passes
        with pytest.raises(TimeoutError):
            await call.read()
        assert 0.15 <= time.monotonic() - started < SLACK_S
        assert server.closed_at == []
        assert await call.drain(2 * SLACK_S)
        assert await _closed(server) - started >= SLACK_S - 0.1  # after the late events
        assert streams.open_connections == 0
        await streams.close()
