"""A client that goes away cancels its generation: the engine stops spending CPU on it."""

from __future__ import annotations

import time

import httpx
import pytest

from deploy.sidecar.supervisor import Sidecar
from tests.support.engine_probe import EngineProcess
from tests.support.gateway import (  # noqa: F401
    BLS_MODEL,
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    SYNC_BLS_MODEL,
    SYNC_ENSEMBLE_MODEL,
    gateway_url,
)
from tests.support.prometheus import value

pytestmark = pytest.mark.slow
# Two sequences of 4000 tokens keep the tiny engine busy for several seconds (about 800 tokens/s
# on one core when idle), well past the second and a half this test looks at.
LONG = {"prompt": "The cat", "max_tokens": 4000, "min_tokens": 4000, "n": 2}


def cpu_rate(engine: EngineProcess, seconds: float) -> float:
    """CPU seconds per second the process uses over the next ``seconds``."""
    start, began = engine.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    return (engine.cpu_seconds() - start) / (time.monotonic() - began)


def wait_until_idle(engine: EngineProcess, timeout_s: float = 15.0) -> None:
    """Let generations of earlier tests drain before measuring this one."""
    deadline = time.monotonic() + timeout_s
    while cpu_rate(engine, 0.3) >= 0.1:
        assert time.monotonic() < deadline, "the engine never became idle"


def in_flight(url: str) -> float:
    return value(httpx.get(f"{url}/metrics").text, "gateway_requests_in_flight")


@pytest.mark.parametrize(
    ("model", "stream"),
    [
        (ENSEMBLE_MODEL, True),
        (ENSEMBLE_MODEL, False),
        (BLS_MODEL, True),
        (BLS_MODEL, False),
        (ENGINE_MODEL, True),
        (ENGINE_MODEL, False),
        # Not decoupled: one answer per request, which the client gives up waiting for.
        (SYNC_ENSEMBLE_MODEL, False),
        (SYNC_BLS_MODEL, False),
    ],
)
def test_disconnect_stops_the_engine(
    gateway_url: str,  # noqa: F811
    sidecar: Sidecar,
    model: str,
    stream: bool,
) -> None:
    engine = EngineProcess(sidecar, f"{model.split('-')[0]}_tensorrt_llm")
    wait_until_idle(engine)
    body = {"model": model, **LONG, "stream": stream}
    # A client that stops reading mid-stream needs no read timeout; one waiting for a whole
    # answer gives up after 0.7 s.
    read = 30.0 if stream else 0.7
    with httpx.Client(base_url=gateway_url, timeout=httpx.Timeout(60, read=read)) as client:
        if stream:
            with client.stream("POST", "/v1/completions", json=body) as response:
                events = 0
                for line in response.iter_lines():
                    events += line.startswith("data: ")
                    if events == 20:
                        busy = cpu_rate(engine, 0.3)
                        break
        else:
            began = engine.cpu_seconds(), time.monotonic()
            with pytest.raises(httpx.ReadTimeout):  # the client gives up and hangs up
                client.post("/v1/completions", json=body)
            busy = (engine.cpu_seconds() - began[0]) / (time.monotonic() - began[1])
    assert busy > 0.25, "the engine should have been generating"
    time.sleep(0.3)  # the engine checks for cancellation every 100 ms
    assert cpu_rate(engine, 1.0) < 0.1, "the engine kept generating after the disconnect"
    assert in_flight(gateway_url) == 1  # only the metrics request itself
