"""Our BLS under load: every stream ends, and no response is freed off a Python thread.

Two ways the Python backend's stub used to lose our BLS, many requests per instance, each on
its own thread. A decoupled BLS call could deadlock the stub (``engine_client`` says how), so
the engine is streamed over gRPC. And the stub freed ended decoupled calls' arrays on a thread
without the GIL, which corrupted its heap. The BLS here runs with a probe
(`tests/support/bls_heap_probe.py`) that makes a free off a Python thread kill the stub at once
and that keeps the stub's threads and the GIL busy, as load does; with decoupled engine calls
the stub hangs or dies within seconds of this test's load.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from tests.support.sidecars import QUICK_STOP

pytestmark = pytest.mark.slow

MODEL = "probe_tensorrt_llm_bls"
CLIENTS = 24
LOAD_S = 6.0
STALL_S = 20
_REPORT = re.compile(r"probe: arrays freed (\d+)")
# Read as a file, not imported: it imports the Python backend's utilities.
PROBE = importlib.util.find_spec("tests.support.bls_heap_probe").origin  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def probed(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """The tiny pipeline, its BLS with the probe in place of its entry point."""
    spec = parse_spec(
        {
            "models": [
                {
                    "name": "probe",
                    "release": "latest",
                    "engine": {"kind": "torch", "model_dir": str(tiny_model_dir)},
                    "bls_instances": 1,
                }
            ],
            "sidecars": [{"name": "probe", **QUICK_STOP}],
        }
    )
    server = sidecar_from_spec(spec, spec.sidecars[0], tmp_path_factory.mktemp("probe"))
    shutil.copyfile(str(PROBE), server.repository / MODEL / "1" / "model.py")
    server.start()
    yield server
    server.stop()


def _stream(server: Sidecar, index: int) -> list[dict[str, object]]:
    body = json.dumps({"text_input": f"a story, part {index}", "max_tokens": 8, "stream": True})
    request = urllib.request.Request(
        f"{server.http_url}/v2/models/{MODEL}/generate_stream",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=STALL_S) as response:
            text = response.read().decode()
    except TimeoutError:
        pytest.fail(f"a stream got nothing for {STALL_S} s, the BLS hangs:\n{server.log_tail()}")
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def _client(server: Sidecar, first: int, until: float) -> int:
    """Stream requests back to back until ``until``; how many."""
    done = 0
    while time.monotonic() < until:
        events = _stream(server, first + done)
        assert events and all("error" not in event for event in events), events
        done += 1
    return done


def _freed(server: Sidecar) -> int:
    reports = _REPORT.findall(server.log_path.read_text(errors="replace"))
    return int(reports[-1]) if reports else 0


def test_concurrent_streams_all_end_and_leave_the_stub_alive(probed: Sidecar) -> None:
    until = time.monotonic() + LOAD_S
    with ThreadPoolExecutor(CLIENTS) as pool:
        counts = list(pool.map(lambda i: _client(probed, i * 10_000, until), range(CLIENTS)))
    assert sum(counts) > CLIENTS, counts
    # The stub still answers, and the probe saw the calls' arrays go (on Python threads, or
    # it would have died).
    assert _stream(probed, -1)
    deadline = time.monotonic() + 20
    while _freed(probed) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _freed(probed) > 0, probed.log_tail()
