"""A client that goes away cancels its generation: the engine stops spending CPU on it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from deploy.sidecar.supervisor import Sidecar
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
TICKS = os.sysconf("SC_CLK_TCK")
# Two sequences of 4000 tokens keep the tiny engine busy for several seconds (about 800 tokens/s
# on one core when idle), well past the second and a half this test looks at.
LONG = {"prompt": "The cat", "max_tokens": 4000, "min_tokens": 4000, "n": 2}


def engine_pid(sidecar: Sidecar, model: str) -> int:
    """The Python-backend stub process running one model of the sidecar."""
    script = str(sidecar.repository / model / "1" / "model.py")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"triton_python_backend_stub" in argv[0] and script.encode() in argv:
            return int(entry.name)
    raise LookupError(f"no stub process runs {script}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def cpu_rate(pid: int, seconds: float) -> float:
    """CPU seconds per second the process uses over the next ``seconds``."""
    start, began = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - start) / (time.monotonic() - began)


def wait_until_idle(pid: int, timeout_s: float = 15.0) -> None:
    """Let generations of earlier tests drain before measuring this one."""
    deadline = time.monotonic() + timeout_s
    while cpu_rate(pid, 0.3) >= 0.1:
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
    engine = engine_pid(sidecar, f"{model.split('-')[0]}_tensorrt_llm")
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
            began = cpu_seconds(engine), time.monotonic()
            with pytest.raises(httpx.ReadTimeout):  # the client gives up and hangs up
                client.post("/v1/completions", json=body)
            busy = (cpu_seconds(engine) - began[0]) / (time.monotonic() - began[1])
    assert busy > 0.25, "the engine should have been generating"
    time.sleep(0.3)  # the engine checks for cancellation every 100 ms
    assert cpu_rate(engine, 1.0) < 0.1, "the engine kept generating after the disconnect"
    assert in_flight(gateway_url) == 1  # only the metrics request itself
