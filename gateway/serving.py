"""Serve the app with uvicorn; SIGTERM drains before the process exits.

On the first SIGTERM (or Ctrl-C) readiness answers 503 at once while requests are still served
for ``limits.drain_delay_s``, so a load balancer stops sending; then new API requests get 503
with ``Retry-After`` while those in flight, streams included, finish for up to
``limits.shutdown_grace_s``; then the app shuts down and its sidecars stop. A second signal
exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from types import FrameType

import uvicorn
from litestar import Litestar

from gateway.lifecycle import Runtime
from gateway.settings import Settings

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """uvicorn, with a drain between the shutdown signal and the closing of the listener."""

    def __init__(
        self,
        config: uvicorn.Config,
        runtime: Runtime,
        settings: Settings,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self._runtime = runtime
        self._settings = settings
        self._on_started = on_started
        self._draining: asyncio.Task[None] | None = None
        self._signalled = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)  # type: ignore[arg-type]
        if self.started and self._on_started is not None:
            self._on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._signalled or self._loop is None or not self.started:
            # A second signal, or one before the server is up: uvicorn's own (prompt) exit.
            self.force_exit = self._signalled
            self.should_exit = True
            return
        self._signalled = True
        logger.info("received %s: draining", signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._draining is None:
            self._draining = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        limits = self._settings.limits
        finished = await self._runtime.lifecycle.drain(
            limits.drain_delay_s, limits.shutdown_grace_s
        )
        if not finished:
            logger.warning(
                "requests still in flight after %.0f s; stopping", limits.shutdown_grace_s
            )
            # The grace is spent: uvicorn must not wait it out a second time.
            self.config.timeout_graceful_shutdown = 1
        self.should_exit = True


def run(app: Litestar, settings: Settings, on_started: Callable[[], None] | None = None) -> None:
    """Serve ``app`` (made by ``create_app(settings)``) until a signal drains and stops it;
    ``on_started`` runs once the app has started and the port listens."""
    server = settings.server
    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_level=settings.log_level.lower(),
        log_config=None,
        timeout_graceful_shutdown=int(settings.limits.shutdown_grace_s),
    )
    DrainingServer(config, app.state["runtime"], settings, on_started).run()
