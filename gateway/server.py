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
import contextlib
import gc
import logging
import resource
import signal
import socket
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn
from litestar import Litestar
from litestar.types import ASGIApp

from gateway.http.door import Door, DoorLimits
from gateway.runtime.base import Runtime
from gateway.settings import Settings, SettingsError

logger = logging.getLogger(__name__)
REPEAT_WINDOW_S = 1.0
"""A second signal this soon after the first is the same request to stop, not a forced exit."""
SPARE_FILES = 512
"""Open files a worker keeps for other uses than client connections: connections to Triton and
Redis, the metrics port, logs, tokenizer files."""


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
        self._signalled_at = 0.0
        self._interrupted = False
        """The first signal was Ctrl-C (SIGINT), from a terminal rather than an orchestrator."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: asyncio.Future[None] | None = None

    async def startup(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        self._watch = asyncio.ensure_future(self._exit_on_failure())
        await super().startup(sockets)  # type: ignore[arg-type]
        if self.started:
            freeze_heap()
        if self.started and self._on_started is not None:
            self._on_started()

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
        self._interrupted = sig == signal.SIGINT
        logger.info("received %s: draining", name)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._draining is None:
            self._draining = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        limits = self._settings.limits
        lifecycle = self._runtime.lifecycle
        # Ctrl-C with nothing in flight: no load balancer to wait for, nothing to finish.
        delay = 0.0 if self._interrupted and lifecycle.idle else limits.drain_delay_s
        finished = await lifecycle.drain(delay, limits.shutdown_grace_s)
        if not finished:
            logger.warning(
                "requests still in flight after %.0f s; stopping", limits.shutdown_grace_s
            )
            # The grace is spent: uvicorn must not wait it out a second time.
            self.config.timeout_graceful_shutdown = 1
        self.should_exit = True


def freeze_heap() -> None:
    """Leave what start-up built (the app, tokenizers, templates, imported modules: some 10^5
    objects) out of every later garbage collection: collected once, then frozen. A full
    collection otherwise walks all of it, one pause of tens of milliseconds for every stream of
    the process; cycles made while serving are still collected. A start-up object in a
    reference cycle that is dropped later (an adapter of the settings unloaded at run time) is
    never collected: a bounded cost, paid once per such object."""
    gc.collect()
    gc.freeze()


def uvicorn_config(app: Litestar, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """How uvicorn serves ``app`` under ``settings`` (``overrides`` replace any of it)."""
    server = settings.server
    options: dict[str, Any] = {
        "host": server.host,
        "port": server.port,
        "log_level": settings.log_level.lower(),
        "log_config": None,
        "timeout_graceful_shutdown": int(settings.limits.shutdown_grace_s),
        "timeout_keep_alive": server.keep_alive_s,
        # httptools, each response's head written with its first body (one send, one packet),
        # within the front door's bounds.
        "http": Door(door_limits(settings)),
        # No route takes a WebSocket: an upgrade would take the connection out of the door.
        "ws": "none",
    }
    return uvicorn.Config(app, **{**options, **overrides})


def door_limits(settings: Settings) -> DoorLimits:
    """What one client may hold of a server of this process."""
    server = settings.server
    return DoorLimits(
        max_head_bytes=server.max_head_bytes,
        head_timeout_s=server.head_timeout_s,
        body_timeout_s=server.body_timeout_s,
        max_connections=server.max_connections,
        max_connections_per_peer=server.max_connections_per_peer,
        retry_after_s=settings.limits.retry_after_s,
    )


def raise_open_files_limit(max_connections: int) -> None:
    """Let this process open as many files as the host allows it (the soft limit is often
    1024), and warn where that leaves fewer than ``server.max_connections`` for clients: past
    it, accepting fails and every client, in the cap or not, waits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = max(soft, min(hard, 1 << 20))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    if soft - SPARE_FILES < max_connections:
        logger.warning(
            "server.max_connections is %d but this process may open only %d files: "
            "raise the open files limit (ulimit -n) or lower server.max_connections",
            max_connections,
            soft,
        )


def run(
    app: Litestar,
    settings: Settings,
    on_started: Callable[[], None] | None = None,
    sockets: list[socket.socket] | None = None,
) -> str | None:
    """Serve ``app`` (made by ``create_app(settings)``) until a signal drains and stops it, or
    until it can never become ready (returns why then); ``on_started`` runs once the app has
    started and the port listens; ``sockets`` are listened on instead of binding the port."""
    config = uvicorn_config(app, settings)
    raise_open_files_limit(settings.server.max_connections)
    runtime: Runtime = app.state["runtime"]
    DrainingServer(config, runtime, settings, on_started).run(sockets)
    return runtime.lifecycle.failure


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket that other processes may bind as well (``SO_REUSEPORT``): the kernel
    spreads new connections among them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class _BesideServer(uvicorn.Server):
    """uvicorn for a second port of the process: the signals stay with the API's server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class SideListener:
    """An ASGI app on a port of its own, served in the running event loop beside the API."""

    def __init__(
        self,
        app: ASGIApp,
        host: str,
        port: int,
        what: str,
        *,
        keep_alive_s: int,
        door: DoorLimits,
        shared: bool = False,
    ) -> None:
        self._app, self._host, self._port, self._what = app, host, port, what
        self._shared = shared
        """Several worker processes listen on the port together."""
        self._keep_alive_s = keep_alive_s
        """How long an idle connection stays open, as on the API's port."""
        self._door = door
        """What one client may hold of the port, as on the API's port (counted apart)."""
        self._server: _BesideServer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen (a port that cannot be bound stops the start, naming the setting)."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        try:
            if self._shared:
                sock = reuse_port_socket(self._host, self._port)
            else:
                sock = socket.create_server((self._host, self._port), family=family)
        except OSError as exc:
            raise SettingsError(
                f"{self._what}: cannot listen on {self._host}:{self._port}: {exc.strerror}"
            ) from exc
        config = uvicorn.Config(
            self._app,
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_keep_alive=self._keep_alive_s,
            http=Door(self._door),  # type: ignore[arg-type]  # a protocol factory serves as well
            ws="none",
        )
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
