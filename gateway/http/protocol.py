"""uvicorn's HTTP/1.1 protocol (httptools), with each response's head sent with its first body,
and, on Python 3.12 and later, each request's app started as soon as the request is read.

uvicorn writes a response's status line and headers as soon as the app sends
``http.response.start``, and the body in writes of its own: two sends and two packets where one
would do. An SSE answer is started with its first chunk ready, so its head and first token leave
in two writes a few tens of microseconds apart, and the client is woken twice. Here a response's
head is held until the next write of its exchange, which carries both; a head with nothing after
it in the same turn of the event loop goes out alone at the start of the next.

uvicorn starts a request's app as a task once its headers are read: the task's first step waits
for its turn of the event loop, behind every callback already due (under load, other streams'
tokens: a few hundred microseconds). Here the task is created once the bytes that arrived are
parsed, the body they carried included, and starts at once (``eager_start``): the request runs
to its first real wait (Triton's answer) before the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

_CONTINUE = b"HTTP/1.1 100 "
EAGER = sys.version_info >= (3, 12)
"""Whether asyncio can start a task in the caller's turn (``Task(eager_start=True)``)."""


class HeadWithBodyProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` whose exchanges write through a ``HeadWithBody`` transport and
    whose apps start eagerly where asyncio can."""

    _reading = False
    _ready: tuple[RequestResponseCycle, Any] | None = None

    def data_received(self, data: bytes) -> None:
        if not EAGER:
            super().data_received(data)
            return
        self._reading = True
        try:
            super().data_received(data)
        finally:
            self._reading = False
            ready, self._ready = self._ready, None
            if ready is not None:
                self._start_now(*ready)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        # A new exchange (its app not started yet), not an upgrade to another protocol.
        if cycle is not None and cycle.transport is self.transport:
            cycle.transport = HeadWithBody(self.transport)  # type: ignore[assignment]

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if self._reading:
            # Started once the rest of what arrived (its body) is parsed. One at most: a request
            # read behind another whose answer is not complete waits in uvicorn's pipeline.
            self._ready = (cycle, app)
            return
        super()._start_asgi_task(cycle, app)

    def _start_now(self, cycle: RequestResponseCycle, app: Any) -> None:
        # uvicorn's opt-in fresh context per request, where it has the option.
        fresh = getattr(self.config, "reset_contextvars", False)
        context = contextvars.Context() if fresh else None
        task = asyncio.Task(  # type: ignore[call-arg]
            cycle.run_asgi(app), loop=self.loop, context=context, eager_start=True
        )
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)


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
