"""uvicorn's HTTP/1.1 protocol (httptools), with each response's head sent with its first body.

uvicorn writes a response's status line and headers as soon as the app sends
``http.response.start``, and the body in writes of its own: two sends and two packets where one
would do. An SSE answer is started with its first chunk ready, so its head and first token leave
in two writes a few tens of microseconds apart, and the client is woken twice. Here a response's
head is held until the next write of its exchange, which carries both; a head with nothing after
it in the same turn of the event loop goes out alone at the start of the next.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_CONTINUE = b"HTTP/1.1 100 "


class HeadWithBodyProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` whose exchanges write through a ``HeadWithBody`` transport."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        # A new exchange (its app not started yet), not an upgrade to another protocol.
        if cycle is not None and cycle.transport is self.transport:
            cycle.transport = HeadWithBody(self.transport)  # type: ignore[assignment]


class HeadWithBody:
    """One exchange's view of its connection's transport: the first write (the response's
    head; an interim ``100 Continue`` excepted) is held and joined to the next."""

    __slots__ = ("_held", "_inner", "_started")

    def __init__(self, inner: asyncio.Transport) -> None:
        self._inner = inner
        self._held: bytes | None = None
        self._started = False

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._inner.write(held + data)
        elif self._started or data.startswith(_CONTINUE):
            self._inner.write(data)
        else:
            self._started = True
            self._held = data
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Send a held head now."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._inner.is_closing():
                self._inner.write(held)

    def close(self) -> None:
        self.flush()
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
