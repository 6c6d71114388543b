"""The HTTP transport's connections to Triton servers: kept alive from one call to the next,
with a spare opened ahead for when none is free.

Why it exists, measured (the capacity bench on 2 cores, ``python -m tests.benchmarks.capacity``;
docs/results/capacity-2cpu.md): with kept-alive connections the gateway added +1.12 and +1.01 ms
to the first token at 8 and 32 paced streams, against +1.43 and +1.40 ms with a connection per
request. httpx's pool, the alternative, cost 2.7 to 16.6 times the CPU per token
(docs/results/http-client.md).
"""

from __future__ import annotations

import asyncio
import contextlib

from adapters.triton.http.wire import split_url

SPARE_MAX_AGE_S = 2.0
IDLE_MAX_AGE_S = 30.0
"""A kept-alive connection idle longer than this is closed rather than sent on."""
IDLE_PER_SERVER = 512
"""Kept-alive connections held idle per server at most; one more is closed."""
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class ConnectionPool:
    """Connections to HTTP servers: those of calls still running, every server's kept-alive
    ones, and its spare, opened ahead for its next call (``adapters.triton.http.call`` says when
    each is used)."""

    def __init__(
        self,
        spare_max_age_s: float = SPARE_MAX_AGE_S,
        *,
        keep_alive_s: float = IDLE_MAX_AGE_S,
    ) -> None:
        self._open: set[asyncio.StreamWriter] = set()
        self._spare_max_age_s = spare_max_age_s
        self._keep_alive_s = keep_alive_s
        """How long a connection may wait idle for the next call; 0 keeps none."""
        self._spares: dict[str, tuple[Connection, float]] = {}
        self._opening: dict[str, asyncio.Task[None]] = {}
        self._idle: dict[str, list[tuple[Connection, float]]] = {}

    async def connect(self, url: str) -> tuple[Connection, bool]:
        """A connection to ``url`` for one call, and whether it was taken ready (kept alive or
        the spare opened ahead) rather than dialled for it."""
        ready = self.take_ready(url)
        if ready is not None:
            return ready, True
        return await self.open(url), False

    def take_ready(self, url: str) -> Connection | None:
        """A connection to ``url`` ready for one call: the one kept alive last, else the spare;
        once the spare is taken or missing, the next starts opening."""
        ready = self._take_idle(url)
        if ready is None:
            ready = self._take_spare(url)
            if url not in self._opening:
                task = asyncio.get_running_loop().create_task(self._open_spare(url))
                self._opening[url] = task
        if ready is not None:
            self._open.add(ready[1])
        return ready

    async def open(self, url: str) -> Connection:
        """A new connection to ``url``, counted as a call's."""
        connection = await _dial(url)
        self._open.add(connection[1])
        return connection

    def release(self, connection: Connection) -> None:
        """Close a call's connection."""
        connection[1].close()
        self._open.discard(connection[1])

    def keep(self, url: str, connection: Connection) -> None:
        """A call's connection whose stream ended cleanly, kept for the server's next call
        (closed where connections are not kept alive, or enough are idle already)."""
        self._open.discard(connection[1])
        idle = self._idle.setdefault(url, [])
        if not (self._keep_alive_s > 0 and _unclosed(connection) and len(idle) < IDLE_PER_SERVER):
            connection[1].close()
            return
        idle.append((connection, asyncio.get_running_loop().time()))

    @property
    def open_connections(self) -> int:
        """Connections of calls still running (kept-alive and spare ones not counted)."""
        return len(self._open)

    @property
    def idle_connections(self) -> int:
        """Kept-alive connections waiting for a call, over every server."""
        return sum(len(idle) for idle in self._idle.values())

    async def close(self) -> None:
        """Close every connection still open, kept-alive and spare ones included."""
        for task in self._opening.values():
            task.cancel()
        await asyncio.gather(*self._opening.values(), return_exceptions=True)
        self._opening = {}
        idle = [connection[1] for kept in self._idle.values() for connection, _ in kept]
        spares = [spare[1] for spare, _ in self._spares.values()]
        writers = [*self._open, *idle, *spares]
        self._open, self._spares, self._idle = set(), {}, {}
        for writer in writers:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()

    def _take_idle(self, url: str) -> Connection | None:
        """The kept-alive connection to ``url`` that ended its call last, if Triton has not
        closed it and it was idle at most ``keep_alive_s`` (older ones are closed)."""
        idle = self._idle.get(url)
        while idle:
            connection = _fresh(*idle.pop(), self._keep_alive_s)
            if connection is not None:
                return connection
        return None

    def _take_spare(self, url: str) -> Connection | None:
        """The spare of ``url`` if it is young and Triton has not closed it (else closed)."""
        entry = self._spares.pop(url, None)
        return None if entry is None else _fresh(*entry, self._spare_max_age_s)

    async def _open_spare(self, url: str) -> None:
        try:
            connection = await _dial(url)
        except OSError:
            # The call that needs it will open its own and report what fails.
            return
        finally:
            self._opening.pop(url, None)
        # ``take_ready`` took any earlier spare before starting this one: none to replace.
        self._spares[url] = (connection, asyncio.get_running_loop().time())


def _unclosed(connection: Connection) -> bool:
    """Whether neither side has closed the connection, as far as the event loop has seen."""
    return not connection[0].at_eof() and not connection[1].is_closing()


def _fresh(connection: Connection, since: float, max_age_s: float) -> Connection | None:
    """``connection``, held since loop time ``since``, if it is at most ``max_age_s`` old and
    open; else closed, and None."""
    if asyncio.get_running_loop().time() - since <= max_age_s and _unclosed(connection):
        return connection
    connection[1].close()
    return None


async def _dial(url: str) -> Connection:
    parts = split_url(url)
    return await asyncio.open_connection(parts.hostname, parts.port or 80)
