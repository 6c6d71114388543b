"""Ctrl-C on an idle gateway stops it at once; SIGTERM still drains (readiness off, serving on)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.server import REPEAT_WINDOW_S

COMMAND = str(Path(sys.executable).parent / "triton-gateway")
# A drain delay no test waits out: a gateway that honours it is still running at the end.
SETTINGS = "tenancy: {auth: false%s}\nlimits: {drain_delay_s: 600}\n"
STORES = {"one process": "", "embedded store, under a parent": ", store: {kind: embedded}"}


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _status(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/health/ready", timeout=2).status_code
    except httpx.HTTPError:
        return None


@pytest.fixture(params=list(STORES), ids=list(STORES))
def gateway(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    (tmp_path / "gateway.yaml").write_text(SETTINGS % STORES[request.param])
    port = _unused_port()
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [COMMAND, "serve", "--config", str(tmp_path / "gateway.yaml"), "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        # No models: the gateway answers, not ready, once it is up.
        while _status(url) is None:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


def test_ctrl_c_with_nothing_in_flight_stops_at_once(
    gateway: tuple[subprocess.Popen[bytes], str],
) -> None:
    process, _ = gateway
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 0


def test_sigterm_still_drains_for_the_load_balancer(
    gateway: tuple[subprocess.Popen[bytes], str],
) -> None:
    process, url = gateway
    process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while _status(url) != 503:  # the signal was taken: it is draining
        assert process.poll() is None and time.monotonic() < deadline, "it never drained"
        time.sleep(0.05)
    # A second signal within the window of the first is the same keypress, sent again.
    time.sleep(REPEAT_WINDOW_S)
    assert process.poll() is None, "the drain delay keeps it serving"
    assert _status(url) == 503
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 0
