"""Whether the gateway takes traffic: started, sidecars up, draining, refusing, or failed for
good; and how many requests are still being answered."""

from __future__ import annotations

import asyncio
import logging

from gateway.errors import ServiceUnavailableError

logger = logging.getLogger(__name__)


class Lifecycle:
    """Whether the gateway takes traffic, and how many requests are still being answered."""

    def __init__(self) -> None:
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

    def refuse_if_draining(self, retry_after_s: int) -> None:
        """Once the drain delay passed, a new API request gets a 503 that sends it elsewhere."""
        if self.refusing:
            raise ServiceUnavailableError(
                "The gateway is shutting down; retry on another replica.",
                code="shutting_down",
                headers={"Retry-After": str(retry_after_s)},
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
