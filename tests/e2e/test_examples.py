"""Each runnable example of `examples/` run as the documentation shows it: `triton-gateway serve`
on its `gateway.yaml`, then its client (only the port is this test's own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gateway import became_ready, free_port, stop_process

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
COMMAND = str(Path(sys.executable).parent / "triton-gateway")


def _run_example(name: str, tmp_path: Path) -> tuple[str, str]:
    """What the client printed, and the gateway's log."""
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [COMMAND, "serve", "--config", f"examples/{name}/gateway.yaml", "--port", str(port)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        assert became_ready(url, server, 300, poll_s=0.5), log.read_text()
        client = subprocess.run(
            [sys.executable, f"examples/{name}/client.py"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env=os.environ | {"OPENAI_BASE_URL": f"{url}/v1"},
        )  # fmt: skip
        assert client.returncode == 0, client.stderr + log.read_text()[-4000:]
        return client.stdout, log.read_text()
    finally:
        stop_process(server)


@pytest.mark.smollm
def test_tools(tmp_path: Path) -> None:
    printed, _ = _run_example("tools", tmp_path)
    assert "tool call: get_weather {'city': " in printed
    assert "structured answer: {'country': " in printed


def test_replicas(tmp_path: Path) -> None:
    printed, log = _run_example("replicas", tmp_path)
    assert "32 answers" in printed
    for replica in ("replica-a", "replica-b"):
        assert f'gateway_replica_up{{model="tiny",replica="{replica}"}} 1.0' in printed
    # The gateway probed both replicas and scraped their metrics all along, and this test
    # polled its readiness: none of it shows at INFO.
    assert [line for line in log.splitlines() if " httpx " in line or " httpcore" in line] == []
    assert "GET /health/ready" not in log and "GET /metrics" not in log
    assert "POST /v1/completions 200" in log


def test_vision(tmp_path: Path) -> None:
    printed, _ = _run_example("vision", tmp_path)
    assert "answer: " in printed
    assert "prompt tokens" in printed
