"""A Triton that accepts connections and never answers: every client still gets an answer."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from adapters.triton.client import TritonBackend
from gateway.app import create_app
from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings


@pytest.fixture(scope="module")
def silent_triton() -> Iterator[str]:
    """A TCP listener that accepts and then says nothing (a hung or half-dead server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    listener.close()


@pytest.fixture(scope="module")
def client(silent_triton: str, tiny_model_dir: Path) -> Iterator[TestClient[Any]]:
    settings = Settings(
        models=(
            ModelSettings(
                name="tiny",
                triton_url=silent_triton,
                triton_model="tiny_ensemble",
                tokenizer_dir=str(tiny_model_dir),
            ),
        ),
        limits=LimitSettings(request_timeout_s=2.0, readiness_timeout_s=1.0, retry_after_s=4),
        tenancy=TenancySettings(auth=False),
    )
    app = create_app(settings, backend_factory=lambda routes: TritonBackend(connect_timeout_s=1))
    with TestClient(app, timeout=30) as test_client:
        yield test_client


@pytest.mark.parametrize("stream", [False, True])
def test_a_hung_triton_is_a_timely_error(client: TestClient[Any], stream: bool) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    start = time.monotonic()
    response = client.post("/v1/chat/completions", json=body)
    assert time.monotonic() - start < 20  # the client gives up at 30 s
    assert response.status_code in (503, 504)
    error = response.json()["error"]
    assert error["code"] in ("backend_unavailable", "timeout")
    if response.status_code == 503:
        assert response.headers["retry-after"] == "4"


def test_readiness_answers_within_its_timeout(client: TestClient[Any]) -> None:
    start = time.monotonic()
    response = client.get("/health/ready")
    assert time.monotonic() - start < 15
    assert response.status_code == 503
    assert response.json()["models"] == {"tiny": False}
