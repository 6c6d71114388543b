"""The HTTP/2 connections of the gRPC calls, by server address: one in use for each server,
shared by every call to it (``h2.H2Connection``), dialled once however many calls wait for it,
and replaced once the server said GOAWAY, the stream ids ran out or the connection went."""

from __future__ import annotations

import asyncio

from adapters.triton.grpc.h2 import H2Connection


class Channels:
    """The HTTP/2 connections to gRPC servers by address (``host:port``): one in use for each,
    shared by every call, dialled when a call needs it."""

    def __init__(self) -> None:
        self._connections: dict[str, H2Connection] = {}
        self._dialling: dict[str, asyncio.Future[H2Connection]] = {}

    def ready(self, url: str) -> H2Connection | None:
        """The address's connection where it can take a call now."""
        connection = self._connections.get(url)
        return connection if connection is not None and connection.has_room() else None

    async def connect(self, url: str) -> H2Connection:
        """The address's connection, dialled where none can take a call (one dial for every
        caller waiting; a caller cancelled leaves it to the others)."""
        connection = self.ready(url)
        if connection is not None:
            return connection
        dialling = self._dialling.get(url)
        if dialling is None:
            dialling = asyncio.ensure_future(self._dial(url))
            self._dialling[url] = dialling
            dialling.add_done_callback(lambda done: self._dialled(url, done))
        return await asyncio.shield(dialling)

    async def close(self) -> None:
        """Close every connection."""
        for dialling in self._dialling.values():
            dialling.cancel()
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()

    async def _dial(self, url: str) -> H2Connection:
        host, _, port = url.rpartition(":")
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(
            lambda: H2Connection(url), host.strip("[]"), int(port)
        )
        return connection

    def _dialled(self, url: str, done: asyncio.Future[H2Connection]) -> None:
        if self._dialling.get(url) is done:
            del self._dialling[url]
        if done.cancelled():
            return
        if done.exception() is None:
            previous = self._connections.get(url)
            self._connections[url] = done.result()
            if previous is not None:
                previous.retire()
