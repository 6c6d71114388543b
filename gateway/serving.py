"""Serve the app with uvicorn; SIGTERM drains before the process exits.

On the first SIGTERM (or Ctrl-C) readiness answers 503 at once while requests are still served
for ``limits.drain_delay_s``, so a load balancer stops sending; then new API requests get 503
with ``Retry-After`` while those in flight, streams included, finish for up to
``limits.shutdown_grace_s``; then the app shuts down and its sidecars stop. A second signal
exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn
from litestar import Litestar
from litestar.types import ASGIApp

from gateway.lifecycle import Runtime
from gateway.settings import Settings, SettingsError

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


class _BesideServer(uvicorn.Server):
    """uvicorn for a second port of the process: the signals stay with the API's server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class SideListener:
    """An ASGI app on a port of its own, served in the running event loop beside the API."""

    def __init__(self, app: ASGIApp, host: str, port: int, what: str) -> None:
        self._app, self._host, self._port, self._what = app, host, port, what
        self._server: _BesideServer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen (a port that cannot be bound stops the start, naming the setting)."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        try:
            sock = socket.create_server((self._host, self._port), family=family)
        except OSError as exc:
            raise SettingsError(
                f"{self._what}: cannot listen on {self._host}:{self._port}: {exc.strerror}"
            ) from exc
        config = uvicorn.Config(self._app, lifespan="off", log_config=None, access_log=False)
        self._server = server = _BesideServer(config)
        self._task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()
        logger.info("%s on http://%s:%d", self._what, self._host, self._port)

    async def stop(self) -> None:
        """Close the port once its open requests are answered."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
