"""Whether the gateway takes traffic: started, sidecars up, draining, refusing, or failed for
good; how many requests are still being answered; and the routers' gate, which refuses requests
while draining.

The gate is what every route of the API and admin routers gets before its handler, from this one
place. A request with a method its route does not take is a 405; while draining, any other is
refused with a 503 that sends it elsewhere; an ``OPTIONS`` is answered with the route's methods.
The framework does the first and the last itself for its own handlers; the completion routes
are plain ASGI handlers (``gateway.openai.pipeline.route``), which it does not dispatch by
method, so the gate does it for them from the methods they declare, in the framework's order
(the 405 before the refusal, as its router raises it before any middleware runs).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from litestar.exceptions import MethodNotAllowedException
from litestar.handlers import ASGIRouteHandler
from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.errors import ServiceUnavailableError

logger = logging.getLogger(__name__)


class Lifecycle:
    """Whether the gateway takes traffic, and how many requests are still being answered."""

    def __init__(self, retry_after_s: int = 1) -> None:
        self.retry_after_s = retry_after_s
        """What a refused request is told to wait before it retries (``Retry-After``)."""
        self.started = False
        self.stopping = False
        """Set on SIGTERM: readiness answers 503 (requests are still served)."""
        self.refusing = False
        """Set once the drain delay passed: new API requests are answered 503."""
        self.sidecars_ready = True
        self.failure: str | None = None
        """Why the gateway can never become ready (a sidecar that could not load at start)."""
        self.failed = asyncio.Event()
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def accepting(self) -> bool:
        """Started, sidecars up, and not shutting down."""
        return self.started and self.sidecars_ready and not self.stopping

    @property
    def idle(self) -> bool:
        """No request is being answered."""
        return self._active == 0

    def refuse_if_draining(self) -> None:
        """Once the drain delay passed, a new API request gets a 503 that sends it elsewhere."""
        if self.refusing:
            raise ServiceUnavailableError(
                "The gateway is shutting down; retry on another replica.",
                code="shutting_down",
                headers={"Retry-After": str(self.retry_after_s)},
            )

    def fail(self, reason: str) -> None:
        """The gateway can never serve: the server exits, non-zero, with ``reason``."""
        self.failure = reason
        self.failed.set()

    def request_started(self) -> None:
        """A request came in."""
        self._active += 1
        self._idle.clear()

    def request_finished(self) -> None:
        """A request was answered."""
        self._active -= 1
        if self._active == 0:
            self._idle.set()

    async def drain(self, delay_s: float, timeout_s: float) -> bool:
        """Turn readiness off, keep serving ``delay_s``, then refuse new requests and wait
        up to ``timeout_s`` for those in flight; ``False`` if some were still running."""
        self.stopping = True
        logger.info("draining: readiness off; serving new requests for %.1f s more", delay_s)
        await asyncio.sleep(delay_s)
        self.refusing = True
        logger.info("draining: refusing new requests; %d in flight", self._active)
        return await self.drained(timeout_s)

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no request is in flight; ``False`` if the timeout passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


def gate(app: ASGIApp) -> ASGIApp:
    """The gate around one route's handler (a litestar middleware factory)."""

    async def gated(scope: Scope, receive: Receive, send: Send) -> None:
        methods = _declared_methods(scope.get("route_handler"))
        method = scope.get("method", "")
        if methods is not None and method not in methods:
            raise MethodNotAllowedException(headers={"allow": ", ".join(methods)})
        lifecycle: Lifecycle = scope["litestar_app"].state.runtime.lifecycle
        lifecycle.refuse_if_draining()
        if methods is not None and method == "OPTIONS":
            allow = [(b"allow", ", ".join(methods).encode())]
            await send({"type": "http.response.start", "status": 204, "headers": allow})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await app(scope, receive, send)

    return gated


def _declared_methods(handler: Any) -> tuple[str, ...] | None:
    """The methods a plain ASGI route declares; ``None`` for the framework's own handlers."""
    if isinstance(handler, ASGIRouteHandler):
        methods: tuple[str, ...] = handler.opt["methods"]
        return methods
    return None
