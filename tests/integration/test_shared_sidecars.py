"""The test run's guard of its shared sidecars: a crash is waited out before the next test, and
reported with the server's last log lines."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from deploy.sidecar.fleet import start_all, stop_all
from deploy.sidecar.spec import parse_spec
from tests.support.shared_sidecars import EXITS_DIR_ENV, SharedSidecars

pytestmark = pytest.mark.slow


def test_the_next_test_waits_for_a_crashed_sidecar_and_the_crash_is_told(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EXITS_DIR_ENV, str(tmp_path / "exits"))
    (tmp_path / "exits").mkdir()
    spec = parse_spec(
        {
            "models": [
                {"name": "t", "engine": {"kind": "loadtest", "tokenizer_dir": str(tiny_model_dir)}}
            ]
        }
    )
    [sidecar] = start_all(spec, tmp_path / "sidecar")
    shared = SharedSidecars()
    try:
        shared.add(sidecar)
        shared.before_test("test_one", True)
        first = sidecar.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        # As after a crash that failed a test: the process has ended.
        deadline = time.monotonic() + 10
        while sidecar.pid == first and time.monotonic() < deadline:
            time.sleep(0.05)
        shared.before_test("test_two", True)
        assert sidecar.is_ready()
        assert sidecar.pid not in (None, first)
        shared.before_test("test_three", True)
        shared.remove(sidecar)
    finally:
        stop_all([sidecar])
    [report] = (tmp_path / "exits").glob("*.txt")
    text = report.read_text()
    assert text.startswith(
        "sidecar main: tritonserver exited with code -9, during or after test_one; "
        "its log before that:\n"
    )
    told_tail = text.split("its log before that:\n", 1)[1].rstrip("\n")
    log = sidecar.log_path.read_text(errors="replace")
    before_marker = log.split("--- sidecar main: tritonserver exited with code -9", 1)[0]
    assert told_tail and before_marker.rstrip("\n").endswith(told_tail)
    assert text.count("sidecar main:") == 1
