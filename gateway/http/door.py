"""The HTTP front door: what a client may hold of a server before the app sees its request.

Each server (each worker process's API port, and its metrics port) keeps its own count: a
cap on open connections, and on those of one peer address; a request head of bounded size
(431 past it, unread beyond it) that must arrive in bounded time (408, or a plain close when
none of it came); a body that must arrive in bounded time after its head (408). A refused
connection gets 503 with ``Retry-After`` and is closed at once. Idle keep-alive connections
are closed by uvicorn (``timeout_keep_alive``). Every answer here closes the connection, and
its body is OpenAI's error object.
"""

from __future__ import annotations

import asyncio
import http
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import msgspec
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.errors import ErrorBody, ErrorEnvelope
from gateway.http.protocol import HeadWithBodyProtocol

logger = logging.getLogger(__name__)
REFUSALS_LOGGED_EVERY_S = 10.0
"""Refused connections are logged as a count at most this often: a flood of them would
otherwise be a flood of log lines."""


@dataclass(frozen=True)
class DoorLimits:
    """The bounds one server keeps (``ServerSettings`` documents each)."""

    max_head_bytes: int = 32 * 1024
    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 4096
    max_connections_per_peer: int = 2048
    retry_after_s: int = 5


class Door:
    """One server's open connections, counted in all and per peer address; its protocols
    are made by calling it (uvicorn's ``http`` factory)."""

    def __init__(self, limits: DoorLimits) -> None:
        self.limits = limits
        self.open = 0
        self.peers: Counter[str] = Counter()
        self._refused = 0
        self._refused_logged_at = -REFUSALS_LOGGED_EVERY_S

    def __call__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> GuardedProtocol:
        return GuardedProtocol(config, server_state, app_state, _loop, door=self)

    def admit(self, peer: str) -> str | None:
        """Count a new connection in, or say why it is refused."""
        limits = self.limits
        if self.open >= limits.max_connections:
            why = f"the server holds its most connections ({limits.max_connections})"
        elif self.peers.get(peer, 0) >= limits.max_connections_per_peer:
            why = f"this address holds its most connections ({limits.max_connections_per_peer})"
        else:
            self.open += 1
            self.peers[peer] += 1
            return None
        self._log_refusal(peer, why)
        return why

    def _log_refusal(self, peer: str, why: str) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._refused_logged_at >= REFUSALS_LOGGED_EVERY_S:
            logger.warning(
                "%d connection(s) refused since the last report; the last from %s: %s",
                self._refused,
                peer,
                why,
            )
            self._refused = 0
            self._refused_logged_at = now

    def leave(self, peer: str) -> None:
        """Count an admitted connection out."""
        self.open -= 1
        left = self.peers[peer] - 1
        if left > 0:
            self.peers[peer] = left
        else:
            del self.peers[peer]


def door_answer(status: int, message: str, *, retry_after_s: int | None = None) -> bytes:
    """A whole response that closes the connection: ``status`` with OpenAI's error object."""
    phrase = http.HTTPStatus(status).phrase
    code = phrase.lower().replace(" ", "_")
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = msgspec.json.encode(ErrorEnvelope(ErrorBody(message, kind, None, code)))
    retry = b"" if retry_after_s is None else b"retry-after: %d\r\n" % retry_after_s
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"%sconnection: close\r\n\r\n%s" % (status, phrase.encode(), len(body), retry, body)
    )


class GuardedProtocol(HeadWithBodyProtocol):
    """``HeadWithBodyProtocol`` within its ``Door``'s bounds.

    A head is counted from its first byte (from the connection's start for the first one) to
    its end; a body from the end of its head to the end of its message. A request read whole
    in one read costs a few comparisons and no timer: within the noise of uvicorn's own 25 us
    of CPU per request (``python -m tests.benchmarks.hostile.door_cost``).
    """

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        door: Door,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._door = door
        self._head_left = door.limits.max_head_bytes
        """Bytes the current head may still take; -1 from its end to its message's end."""
        self._heads = 0
        self._head_begun = False
        self._timer: asyncio.TimerHandle | None = None
        self._peer: str | None = None
        """The peer address counted in the door; None for a connection turned away."""
        self._turned_away = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = self.client[0] if self.client else ""
        refused = self._door.admit(peer)
        if refused is not None:
            self._turn_away(503, refused, retry_after_s=self._door.limits.retry_after_s)
            return
        self._peer = peer
        self._arm(self._door.limits.head_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._peer is not None:
            self._door.leave(self._peer)
            self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._turned_away:
            return
        left = self._head_left
        if left < 0:
            super().data_received(data)
        elif len(data) > left:
            self._head_begun = True
            self._past_head_limit(data, left)
        else:
            self._head_begun = True
            self._head_left = left - len(data)
            super().data_received(data)
        self._watch()

    def _watch(self) -> None:
        """Arm the timer for what the connection still owes: the rest of a head, or of a body.
        A request read whole in one read arms none."""
        if self._timer is not None or self._turned_away or self.transport.is_closing():
            return
        limits = self._door.limits
        if self._head_left < 0:
            self._arm(limits.body_timeout_s, self._body_late)
        elif self._head_begun:
            self._arm(limits.head_timeout_s, self._head_late)

    def _past_head_limit(self, data: bytes, left: int) -> None:
        """Parse only what the head may take: a head that has not ended by then is refused
        without reading the rest; what follows a head that has goes on as usual."""
        heads = self._heads
        self._head_left = 0
        super().data_received(data[:left])
        if self._heads == heads:
            if not self.transport.is_closing():
                limit = self._door.limits.max_head_bytes
                self._turn_away(431, f"the request head is larger than {limit} bytes")
            return
        if not self.transport.is_closing():
            self.data_received(data[left:])

    def on_headers_complete(self) -> None:
        self._heads += 1
        self._head_left = -1
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._head_left = self._door.limits.max_head_bytes
        self._head_begun = False
        super().on_message_complete()

    def _arm(self, delay_s: float, callback: Any) -> None:
        self._timer = self.loop.call_later(delay_s, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_late(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if not self._head_begun:
            # Nothing of a request came: a plain close, as for an idle connection.
            self.transport.close()
            return
        limit = self._door.limits.head_timeout_s
        self._turn_away(408, f"the request head did not arrive within {limit:g} s")

    def _body_late(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            limit = self._door.limits.body_timeout_s
            self._turn_away(408, f"the request body did not arrive within {limit:g} s")
        else:
            self.transport.close()
        if cycle is not None and not cycle.response_complete:
            # The app reading the body sees the client gone, and writes nothing more.
            cycle.disconnected = True
            cycle.message_event.set()

    def _turn_away(self, status: int, message: str, *, retry_after_s: int | None = None) -> None:
        """Answer ``status`` and close; nothing more is read from the connection."""
        self._turned_away = True
        self._disarm()
        self.transport.write(door_answer(status, message, retry_after_s=retry_after_s))
        self.transport.close()
