"""The front door's connection cap under ``server.workers``: each worker process keeps its own,
so the port holds the workers times the cap; one more connection is answered 503."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from deploy.sidecar.parentdeath import dying_with_parent
from tests.support.gateway import free_port, stop_process

pytestmark = pytest.mark.slow
WORKERS = 2
CAP = 3
CONNECTIONS = 40
"""Enough that the kernel's spread gives every worker at least its cap (a worker left with
fewer than 3 of 40 has odds below 10^-8)."""


def _first_answer(client: socket.socket) -> str:
    """The status of what the server says first ("none" while it says nothing)."""
    client.settimeout(1.0)
    try:
        data = client.recv(4096)
    except TimeoutError:
        return "none"
    return data.split(b" ")[1].decode() if data.startswith(b"HTTP/") else "closed"


def _serve(workdir: Path) -> tuple[int, subprocess.Popen[bytes]]:
    """``triton-gateway serve`` with no model, once every worker has started (its readiness,
    which needs a model, is not waited for)."""
    port = free_port()
    config = {
        "server": {"port": port, "workers": WORKERS, "max_connections": CAP,
                   "head_timeout_s": 60},
        "tenancy": {"auth": False},
        "log_level": "INFO",
    }  # fmt: skip
    (workdir / "gateway.yaml").write_text(yaml.safe_dump(config))
    command, preexec = dying_with_parent(
        [str(Path(sys.executable).parent / "triton-gateway"), "serve", "--config",
         str(workdir / "gateway.yaml")]
    )  # fmt: skip
    log = workdir / "gateway.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, preexec_fn=preexec
        )
    deadline = time.monotonic() + 120
    while log.read_text().count("Application startup complete.") < WORKERS:
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process)
            raise RuntimeError(f"the gateway did not start: {log.read_text()}")
        time.sleep(0.2)
    return port, process


def test_each_worker_keeps_its_own_connection_cap() -> None:
    port, process = _serve(Path(tempfile.mkdtemp(prefix="door-workers-")))
    clients: list[socket.socket] = []
    try:
        for _ in range(CONNECTIONS):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        answers = Counter(_first_answer(client) for client in clients)
    finally:
        for client in clients:
            client.close()
        stop_process(process)
    assert answers == {"none": WORKERS * CAP, "503": CONNECTIONS - WORKERS * CAP}
