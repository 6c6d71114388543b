"""Serve the app with uvicorn; SIGTERM drains before the process exits.

On the first SIGTERM (or Ctrl-C) readiness answers 503 at once while requests are still served
for ``limits.drain_delay_s``, so a load balancer stops sending; then new API requests get 503
with ``Retry-After`` while those in flight, streams included, finish for up to
``limits.shutdown_grace_s``; then the app shuts down and its sidecars stop. A second signal
(a second after the first or later) stops without waiting for requests; the sidecars still stop
and the temporary model repository is still removed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from types import FrameType

import uvicorn
from litestar import Litestar

from gateway.lifecycle import Runtime
from gateway.settings import Settings

logger = logging.getLogger(__name__)
REPEAT_WINDOW_S = 1.0
"""A second signal this soon after the first is the same request to stop, not a forced exit."""


class DrainingServer(uvicorn.Server):
    """uvicorn, with a drain between the shutdown signal and the closing of the listener."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime, settings: Settings) -> None:
        super().__init__(config)
        self._runtime = runtime
        self._settings = settings
        self._draining: asyncio.Task[None] | None = None
        self._signalled = False
        self._signalled_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: asyncio.Future[None] | None = None

    async def startup(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        self._watch = asyncio.ensure_future(self._exit_on_failure())
        await super().startup(sockets)  # type: ignore[arg-type]

    async def _exit_on_failure(self) -> None:
        """A gateway that can never become ready exits instead of answering 503 for good."""
        await self._runtime.lifecycle.failed.wait()
        self.should_exit = True

    async def shutdown(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        for task in (self._watch, self._draining):
            if task is not None:
                task.cancel()
        await super().shutdown(sockets)  # type: ignore[arg-type]

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        name = signal.Signals(sig).name
        now = time.monotonic()
        if self._loop is None or not self.started:
            # A signal before the server is up: uvicorn's own (prompt) exit.
            self.force_exit = self._signalled
            self._signalled = True
            self.should_exit = True
            return
        if self._signalled and now - self._signalled_at < REPEAT_WINDOW_S:
            # The same stop, delivered twice: to the process group and forwarded by a parent
            # (make does this), or Ctrl-C seen by both. Only a later signal hurries the exit.
            logger.info("received %s again: already draining", name)
            return
        if self._signalled:
            logger.info("received %s again: stopping without waiting for requests", name)
            self._runtime.hurry()
            self.config.timeout_graceful_shutdown = 1
            self.should_exit = True
            return
        self._signalled = True
        self._signalled_at = now
        logger.info("received %s: draining", name)
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


def run(app: Litestar, settings: Settings) -> str | None:
    """Serve ``app`` (made by ``create_app(settings)``) until a signal drains and stops it, or
    until it can never become ready; returns why in that case."""
    server = settings.server
    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_level=settings.log_level.lower(),
        log_config=None,
        timeout_graceful_shutdown=int(settings.limits.shutdown_grace_s),
    )
    runtime: Runtime = app.state["runtime"]
    DrainingServer(config, runtime, settings).run()
    return runtime.lifecycle.failure
