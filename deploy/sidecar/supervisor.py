"""Supervise tritonserver sidecars: start, wait for readiness, restart on crashes, stop cleanly."""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from deploy.sidecar.frontend import keeper as response_keeper
from deploy.sidecar.parentdeath import dying_with_parent
from deploy.sidecar.ports import free_port
from deploy.sidecar.stubs import StubWatch
from deploy.sidecar.tritonbin import (
    ServerArgs,
    TritonBinary,
    build_command,
    orchestrator_env,
)
from deploy.triton.params import GRPC_URL_ENV, local_grpc_url

logger = logging.getLogger(__name__)
SHM_DIR = Path("/dev/shm")
ERROR_LINE = re.compile(r"^E\d{4} |^error: ")
_LIVE: weakref.WeakSet[Sidecar] = weakref.WeakSet()


class SidecarError(RuntimeError):
    """A sidecar that did not start, or stopped serving for good."""


KEEPER_CHECK_S = 5.0
"""How long a started tritonserver is given to show the response keeper mapped."""
EXIT_LOG_LINES = 40
"""Lines of the server log kept with each unplanned exit."""


@dataclass(frozen=True, slots=True)
class SidecarExit:
    """tritonserver ended without being asked to: its exit code (negative: the signal), why,
    and the last lines it logged."""

    code: int | None
    reason: str
    log_tail: str


class Sidecar:
    """One tritonserver process hosting a rendered repository, restarted with backoff on crashes."""

    def __init__(
        self,
        name: str,
        repository: Path,
        binary: TritonBinary,
        *,
        host: str = "127.0.0.1",
        http_port: int = 0,
        grpc_port: int = 0,
        metrics_port: int = 0,
        env: dict[str, str] | None = None,
        orchestrator_gpus: tuple[int, ...] | None = None,
        startup_timeout_s: float = 300.0,
        max_restarts: int = 5,
        backoff_s: tuple[float, float] = (0.5, 30.0),
        log_path: Path | None = None,
        log_verbose: int = 0,
        extra_args: tuple[str, ...] = (),
        stop_grace_s: float = 15.0,
        keeper: Path | None = None,
    ) -> None:
        self.name = name
        self.repository = Path(repository)
        self.binary = binary
        self.host = host
        self.http_port = http_port or free_port(host)
        self.grpc_port = grpc_port or free_port(host)
        self.metrics_port = metrics_port or free_port(host)
        self.startup_timeout_s = startup_timeout_s
        self.max_restarts = max_restarts
        self.stop_grace_s = stop_grace_s
        self.backoff_s = backoff_s
        self.log_path = log_path or self.repository.parent / f"{name}.log"
        self.restarts = 0
        self.exits: list[SidecarExit] = []
        """Every time tritonserver ended without being stopped, oldest first."""
        self._env = {**binary.env, **(orchestrator_env() if orchestrator_gpus is not None else {})}
        self._env[GRPC_URL_ENV] = local_grpc_url(host, self.grpc_port)
        self._env.update(env or {})
        self.keeper = keeper
        """The response keeper preloaded into tritonserver (``deploy.sidecar.frontend.keeper``)."""
        if keeper is not None:
            current = self._env.get("LD_PRELOAD") or os.environ.get("LD_PRELOAD")
            self._env["LD_PRELOAD"] = response_keeper.preload_value(keeper, current)
        self._args = ServerArgs(
            repository=self.repository,
            host=host,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            shm_prefix=f"tgw_{name}_{uuid.uuid4().hex[:8]}_",
            orchestrator_gpus=orchestrator_gpus,
            log_verbose=log_verbose,
            extra_args=extra_args,
            stub_timeout_s=max(1, math.ceil(startup_timeout_s)),
        )
        self._process: subprocess.Popen[bytes] | None = None
        self._spawned = threading.Event()
        self._stopping = threading.Event()
        self._spawn_lock = threading.Lock()
        self._ever_ready = False
        self._kept = threading.Event()
        """Set once the watcher saw the running server ready with the keeper loaded."""
        self.failed = threading.Event()
        """Set once the sidecar stopped serving for good (start failure or too many crashes)."""
        self._failed: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def command(self) -> list[str]:
        """The tritonserver command line."""
        return build_command(self.binary, self._args)

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP/REST endpoint."""
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """URL of tritonserver's Prometheus metrics."""
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def keeps_responses(self) -> bool:
        """Whether tritonserver runs with the response keeper: its HTTP frontend loses no
        streamed response (``start`` checks that it was loaded)."""
        return self.keeper is not None

    @property
    def pid(self) -> int | None:
        """PID of the running tritonserver, if any."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def is_ready(self, timeout: float = 2.0) -> bool:
        """Whether tritonserver answers ready (all its models loaded).

        Any caller seeing it ready counts: a server killed right after a caller saw it ready,
        before the watcher polled, has started and is restarted rather than given up on.
        """
        url = f"{self.http_url}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                ready = bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False
        self._ever_ready |= ready
        return ready

    def start(self) -> Sidecar:
        """Start tritonserver and block until it is ready; raise with the log's tail otherwise."""
        if self._thread is not None:
            raise SidecarError(f"sidecar {self.name!r} was already started")
        self._thread = threading.Thread(target=self._run, name=f"sidecar-{self.name}", daemon=True)
        _LIVE.add(self)
        self._thread.start()
        try:
            self.wait_ready(self.startup_timeout_s, first_start=True)
            self._await_keeper()
        except BaseException:
            self.stop()
            raise
        logger.info("sidecar %s ready (pid %s, grpc %s)", self.name, self.pid, self.grpc_url)
        return self

    def _kept_by(self, process: subprocess.Popen[bytes]) -> bool:
        """Whether ``process`` runs with the keeper, where it should, or has ended (a process
        killed as it answered ready is an exit, not a server without the keeper). Looked at
        again for a while: "ready" may have come before it exec'd tritonserver (another server
        on a port given up by the one before)."""
        if self.keeper is None:
            return True
        deadline = time.monotonic() + KEEPER_CHECK_S
        while not response_keeper.loaded_by(process.pid, self.keeper):
            if process.poll() is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def _await_keeper(self) -> None:
        """Wait for the watcher's check of the keeper in the ready server (it restarts a server
        that ended before the check, and gives up one that runs without the keeper)."""
        if self.keeper is None:
            return
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._kept.wait(0.1):
            if self._failed is not None:
                raise SidecarError(f"{self._failed}; {self._diagnosis()}")
            if self._stopping.is_set():
                raise SidecarError(f"sidecar {self.name!r} was stopped while starting")
            if time.monotonic() >= deadline:
                raise SidecarError(
                    f"the response keeper of sidecar {self.name!r} was not checked in "
                    f"{self.startup_timeout_s:.0f} s; {self._diagnosis()}"
                )

    def wait_ready(self, timeout: float, *, first_start: bool = False) -> None:
        """Block until tritonserver is ready, it exits for good, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        self._spawned.wait(timeout)
        while time.monotonic() < deadline:
            if self._failed is not None:
                raise SidecarError(f"{self._failed}; {self._diagnosis()}")
            process = self._process
            if first_start and process is not None and process.poll() is not None:
                raise SidecarError(
                    f"tritonserver of sidecar {self.name!r} exited with code "
                    f"{process.returncode} while starting; {self._diagnosis()}"
                )
            if self.is_ready(timeout=1.0):
                return
            time.sleep(0.2)
        raise SidecarError(
            f"sidecar {self.name!r} not ready after {timeout:.0f} s; {self._diagnosis()}"
        )

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM, wait ``grace_s`` (``stop_grace_s`` unless given) for tritonserver to unload
        its models, then SIGKILL the whole process group; remove shm leftovers. A grace of 0
        kills at once."""
        grace_s = self.stop_grace_s if grace_s is None else grace_s
        with self._spawn_lock:
            # Under the lock no new process can be spawned after this one is read.
            self._stopping.set()
            process = self._process
        if process is not None and process.poll() is None and grace_s > 0:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("sidecar %s ignored SIGTERM for %.0f s; killing", self.name, grace_s)
        self._kill_group()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=grace_s)
        self._remove_shm()
        _LIVE.discard(self)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server log."""
        try:
            with open(self.log_path, errors="replace") as log:
                return "".join(deque(log, maxlen=lines))
        except FileNotFoundError:
            return "(no log)"

    def error_lines(self, lines: int = 20) -> str:
        """The last error lines tritonserver logged (model load failures among them)."""
        try:
            with open(self.log_path, errors="replace") as log:
                return "".join(deque((line for line in log if ERROR_LINE.match(line)), lines))
        except FileNotFoundError:
            return ""

    def _diagnosis(self) -> str:
        errors = self.error_lines()
        return (f"errors logged:\n{errors}" if errors else "") + f"log tail:\n{self.log_tail()}"

    def __enter__(self) -> Sidecar:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        env = {**os.environ, **self._env}
        command, preexec = dying_with_parent(self.command)
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=preexec,
        )

    def _run(self) -> None:
        """Own the process: spawning happens here so PDEATHSIG follows this long-lived thread."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        delay = self.backoff_s[0]
        with open(self.log_path, "ab") as log:
            while True:
                with self._spawn_lock:
                    if self._stopping.is_set():
                        return
                    self._kept.clear()
                    self._process = self._spawn(log)
                self._spawned.set()
                # Read after the watch: a caller may have seen it ready while it ran.
                was_ready, broken = self._watch(self._process)
                self._ever_ready = self._ever_ready or was_ready
                if self._stopping.is_set():
                    return
                code = self._process.returncode
                self._kill_group()
                self._remove_shm()
                self._record_exit(log, code, broken)
                if not self._ever_ready:
                    self._give_up(
                        f"tritonserver of sidecar {self.name!r} exited with code {code} "
                        "while starting"
                    )
                    return
                if self.restarts >= self.max_restarts:
                    self._give_up(f"sidecar {self.name!r} crashed {self.restarts + 1} times")
                    return
                logger.warning(
                    "sidecar %s exited with %s; restart in %.1f s", self.name, code, delay
                )
                if self._stopping.wait(delay):
                    return
                self.restarts += 1
                delay = min(delay * 2, self.backoff_s[1])

    def _record_exit(self, log: IO[bytes], code: int | None, broken: str | None) -> None:
        """Remember an unplanned exit with the log lines before it, and mark it in the log."""
        if broken is not None:
            reason = (
                f"the Python stub of model {broken} died while Triton still called the model "
                "ready; tritonserver was killed to start it again"
            )
        else:
            reason = f"tritonserver exited with code {code}"
        self.exits.append(SidecarExit(code, reason, self.log_tail(EXIT_LOG_LINES)))
        log.write(f"--- sidecar {self.name}: {reason}\n".encode())
        log.flush()

    def _give_up(self, reason: str) -> None:
        self._failed = reason
        logger.error("%s; giving up", reason)
        self.failed.set()

    def _watch(self, process: subprocess.Popen[bytes]) -> tuple[bool, str | None]:
        """Wait for the process to exit: whether it had become ready, and the model whose Python
        stub died (the server is then killed: nothing else would make that model serve again)."""
        was_ready = False
        stubs: StubWatch | None = None
        while process.poll() is None:
            if not was_ready and self.is_ready(timeout=1.0):
                was_ready = True
                if not self._kept_by(process):
                    # A restart without the keeper would lose responses without a word.
                    with self._spawn_lock:
                        self._stopping.set()
                        self._kill_group()
                    process.wait()
                    self._give_up(
                        f"tritonserver of sidecar {self.name!r} did not load the response "
                        f"keeper {self.keeper}; keep_responses: false in its spec runs it without"
                    )
                    break
                if process.poll() is None:
                    self._kept.set()
                stubs = self._stub_watch(process.pid)
            elif stubs is not None and (broken := self._dead_stub(stubs)) is not None:
                with self._spawn_lock:
                    if self._stopping.is_set():
                        break
                    logger.error(
                        "sidecar %s: the Python stub of model %s died; restarting tritonserver",
                        self.name,
                        broken,
                    )
                    self._kill_group()
                process.wait()
                return was_ready, broken
            if self._stopping.wait(0.2 if not was_ready else 0.5):
                process.wait()
                break
        return was_ready, None

    def _stub_watch(self, pid: int) -> StubWatch | None:
        try:
            return StubWatch.of_server(pid, self.repository, self.http_url)
        except Exception:
            logger.warning("sidecar %s: stubs cannot be watched", self.name, exc_info=True)
            return None

    def _dead_stub(self, stubs: StubWatch) -> str | None:
        try:
            return stubs.check()
        except Exception:
            logger.debug("sidecar %s: checking its Python stubs failed", self.name, exc_info=True)
            return None

    def _kill_group(self) -> None:
        process = self._process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)

    def _remove_shm(self) -> None:
        for leftover in SHM_DIR.glob(f"{self._args.shm_prefix}*"):
            with contextlib.suppress(OSError):
                leftover.unlink()


@atexit.register
def _stop_live() -> None:
    for sidecar in list(_LIVE):
        sidecar.stop(grace_s=5.0)
