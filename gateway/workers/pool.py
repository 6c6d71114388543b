"""The parent of the worker processes: sidecars, the embedded Redis and the workers, supervised
once per host; signals passed on to every worker."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

import msgspec
from prometheus_client import multiprocess

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import Spec
from deploy.sidecar.supervisor import Sidecar
from gateway.catalog.transports import build_keepers
from gateway.runtime.shared import write_state
from gateway.runtime.spec import resolve_spec
from gateway.server import REPEAT_WINDOW_S
from gateway.settings import Settings
from gateway.workers.child import CANNOT_SERVE, WorkerPayload, run_worker
from gateway.workers.redis import EmbeddedRedis

logger = logging.getLogger(__name__)
WATCH_S = 0.5
RESTART_BACKOFF_S = 1.0
STOP_MARGIN_S = 15.0


def worker_settings(settings: Settings, redis: EmbeddedRedis | None) -> Settings:
    """What each worker serves: one process each, the limits in the shared Redis."""
    server = msgspec.structs.replace(settings.server, workers=1)
    tenancy = settings.tenancy
    if redis is not None:
        store = msgspec.structs.replace(tenancy.store, kind="redis", url=redis.url)
        tenancy = msgspec.structs.replace(tenancy, store=store)
    return msgspec.structs.replace(settings, server=server, tenancy=tenancy)


def needs_embedded_redis(settings: Settings) -> bool:
    """The embedded store asked for, or several workers sharing limits in a store left to
    ``auto`` (several workers with ``memory`` named are refused)."""
    kind = settings.tenancy.store.kind
    return kind == "embedded" or (settings.server.workers > 1 and kind == "auto")


def embedded_data_file(settings: Settings) -> Path | None:
    """Where the embedded store keeps its data, if anywhere."""
    path = settings.tenancy.store.path
    return Path(path) if path is not None and settings.tenancy.store.kind == "embedded" else None


class Pool:
    """Runs ``settings.server.workers`` gateway processes on one port until a signal stops them.

    ``folder`` holds what the processes share: the sidecars' state, the Prometheus files and the
    embedded Redis's socket.
    """

    def __init__(self, settings: Settings, folder: Path, spec: Spec | None) -> None:
        self.settings = settings
        self.folder = folder
        self.spec = spec
        """The deploy spec as ``serve`` read it; its built-in model names resolved here, once,
        and the workers given the result."""
        self.state_file = folder / "sidecars.json"
        self.metrics_dir = folder / "metrics"
        self.redis = (
            EmbeddedRedis(folder, embedded_data_file(settings))
            if needs_embedded_redis(settings)
            else None
        )
        self.sidecars: list[Sidecar] = []
        self.ready = False
        self.failure: str | None = None
        self.stopping = threading.Event()
        self._workers: list[BaseProcess | None] = [None] * settings.server.workers
        self._started_at = [0.0] * settings.server.workers
        self._signalled_at: float | None = None
        self._hurried = False
        self._context = multiprocessing.get_context("spawn")

    def run(self) -> int:
        """Serve until stopped; 1 when the gateway could never serve (the reason is logged)."""
        self.metrics_dir.mkdir()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)
        try:
            self._prepare_sidecars()
            if self.redis is not None:
                self.redis.start()
            payload = msgspec.json.encode(
                WorkerPayload(worker_settings(self.settings, self.redis), self.spec)
            )
            for index in range(len(self._workers)):
                self._start_worker(index, payload)
            self._install_signals()
            threading.Thread(target=self._start_sidecars, name="sidecars", daemon=True).start()
            while not self.stopping.wait(WATCH_S):
                self._watch(payload)
        finally:
            self._stop_all()
        return 1 if self.failure is not None else 0

    def _prepare_sidecars(self) -> None:
        sidecars = self.settings.sidecars
        if sidecars is None or self.spec is None:
            return
        self.spec = spec = resolve_spec(self.spec)
        workdir = Path(sidecars.workdir) if sidecars.workdir else self.folder / "sidecars"
        keepers = build_keepers(self.settings, spec)
        self.sidecars = [
            sidecar_from_spec(spec, s, workdir, response_keeper=keepers[s.name])
            for s in spec.sidecars
        ]
        write_state(self.state_file, self.sidecars, ready=False)

    def _start_sidecars(self) -> None:
        for sidecar in self.sidecars:
            try:
                sidecar.start()
            except Exception as exc:
                self._fail(f"sidecar {sidecar.name!r} could not start: {exc}")
                return
        self.ready = True

    def _start_worker(self, index: int, payload: bytes) -> None:
        shared = str(self.state_file) if self.sidecars else None
        process = self._context.Process(
            target=run_worker,
            args=(payload, index, shared, os.getpid()),
            name=f"gateway-worker-{index}",
        )
        process.start()
        self._workers[index] = process
        self._started_at[index] = time.monotonic()
        logger.info("worker %d started (pid %s)", index, process.pid)

    def _watch(self, payload: bytes) -> None:
        if self.sidecars:
            write_state(self.state_file, self.sidecars, ready=self.ready)
        if self.redis is not None:
            self.redis.watch()
        for index, process in enumerate(self._workers):
            if process is None or process.is_alive():
                continue
            self._forget(process)
            if process.exitcode == CANNOT_SERVE:
                self._fail(f"worker {index} cannot serve this configuration (its log says why)")
                return
            if time.monotonic() - self._started_at[index] < RESTART_BACKOFF_S:
                continue
            logger.warning("worker %d exited (%s); starting it again", index, process.exitcode)
            self._start_worker(index, payload)

    def _fail(self, reason: str) -> None:
        logger.error("%s", reason)
        self.failure = reason
        self._stop_workers()
        self.stopping.set()

    def _install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        name = signal.Signals(sig).name
        if self._signalled_at is not None and now - self._signalled_at < REPEAT_WINDOW_S:
            logger.info("received %s again: already draining", name)
            return
        if self._signalled_at is not None:
            logger.info("received %s again: every worker stops without waiting", name)
            self._hurried = True
        else:
            logger.info("received %s: every worker drains", name)
        self._signalled_at = now
        self._stop_workers(sig)
        self.stopping.set()

    def _stop_workers(self, sig: int = signal.SIGTERM) -> None:
        # The signal the parent got: a worker stops at once on an idle Ctrl-C, drains on SIGTERM.
        for process in self._workers:
            if process is not None and process.is_alive() and process.pid is not None:
                os.kill(process.pid, sig)

    def _stop_all(self) -> None:
        """Wait for the workers to drain, then stop the sidecars and Redis."""
        limits = self.settings.limits
        grace = limits.drain_delay_s + limits.shutdown_grace_s + STOP_MARGIN_S
        deadline = time.monotonic() + grace
        for process in self._workers:
            if process is None:
                continue
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                logger.warning("worker %s did not stop in time; killing it", process.pid)
                process.kill()
                process.join()
            self._forget(process)
        for sidecar in reversed(self.sidecars):
            sidecar.stop(2.0 if self._hurried else 15.0)
        if self.redis is not None:
            self.redis.stop()

    def _forget(self, process: BaseProcess) -> None:
        """A finished worker's live gauges leave the sums."""
        if process.pid is not None:
            folder = str(self.metrics_dir)
            multiprocess.mark_process_dead(process.pid, folder)  # type: ignore[no-untyped-call]
