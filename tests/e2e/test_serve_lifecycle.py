"""Starting and stopping ``triton-gateway serve``.

A sidecar that can never load makes ``serve`` exit non-zero with the reason. A signal delivered
twice at once (to the process group and forwarded by ``make``) is one drain; a later second
signal stops without waiting. Either way no traceback, no sidecar left running and no temporary
model repository left behind. Each ``serve`` gets a temporary folder of its own (``TMPDIR``), so
its leftovers are told apart from other processes' (tests run in parallel)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.gateway import serve_process

pytestmark = pytest.mark.slow


def _config(model_dir: Path, drain_delay_s: float) -> dict[str, Any]:
    engine = {"kind": "loadtest", "tokenizer_dir": str(model_dir)}
    spec = {"models": [{"name": "lt", "engine": engine}]}
    return {
        "sidecars": {"inline": spec},
        "tenancy": {"auth": False},
        "limits": {"drain_delay_s": drain_delay_s, "shutdown_grace_s": 30},
    }


def _own_tmp(tmp_path: Path) -> Path:
    """The ``TMPDIR`` of a ``serve`` started by the test of ``tmp_path``."""
    folder = tmp_path / "tmp"
    folder.mkdir(exist_ok=True)
    return folder


def _workdirs(tmp: Path) -> set[Path]:
    """The temporary model repositories a ``serve`` with ``TMPDIR=tmp`` made and left."""
    return set(tmp.glob("triton-gateway-*"))


def _tritonservers(tmp: Path) -> set[int]:
    """The tritonservers serving a repository under ``tmp``."""
    import psutil

    found = set()
    for process in psutil.process_iter(["name", "cmdline"]):
        if process.info["name"] == "tritonserver" and str(tmp) in " ".join(
            process.info["cmdline"] or ()
        ):
            found.add(process.pid)
    return found


def _stop(process: subprocess.Popen[bytes], gap_s: float) -> float:
    """Two SIGTERMs ``gap_s`` apart; the seconds until the process exited."""
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    time.sleep(gap_s)
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
    return time.monotonic() - sent


@pytest.mark.parametrize(
    ("gap_s", "drain_delay_s", "expected"),
    [(0.05, 3.0, "already draining"), (1.5, 60.0, "stopping without waiting")],
    ids=["same-stop-twice", "second-stop-later"],
)
def test_two_signals(
    tiny_model_dir: Path, tmp_path: Path, gap_s: float, drain_delay_s: float, expected: str
) -> None:
    tmp = _own_tmp(tmp_path)
    _, process = serve_process(
        _config(tiny_model_dir, drain_delay_s), tmp_path, "stop", env={"TMPDIR": str(tmp)}
    )
    assert _workdirs(tmp), "serve made its temporary model repository"
    assert _tritonservers(tmp), "serve runs its sidecar from there"

    took = _stop(process, gap_s)

    log = (tmp_path / "stop.log").read_text()
    assert expected in log
    assert "Traceback" not in log
    if gap_s < 1:
        assert took >= drain_delay_s, "a repeated signal must not cut the drain short"
    else:
        assert took < 15, "a later second signal does not wait out the drain"
    assert not _workdirs(tmp)
    assert not _tritonservers(tmp)


def test_serve_exits_with_the_reason_when_a_sidecar_cannot_load(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Not a banner and a gateway that is never ready: exit 1, the engine's error, no leftovers."""
    empty = tmp_path / "no-model"
    empty.mkdir()
    # A folder with something in it passes the checks at start; only the engine finds no model.
    (empty / "notes.txt").write_text("no weights here")
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "sidecars:\n  inline:\n    models:\n      - name: m\n"
        f"        tokenizer_dir: {tiny_model_dir}\n"
        f"        engine: {{kind: torch, model_dir: {empty}}}\n"
        "models: [{name: m, pipeline: m}]\ntenancy: {auth: false}\n"
    )
    command = [str(Path(sys.executable).parent / "triton-gateway"), "serve", "--config",
               str(config), "--port", "0"]  # fmt: skip
    tmp = _own_tmp(tmp_path)
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "TMPDIR": str(tmp)},
    )

    assert done.returncode == 1
    error = done.stderr[done.stderr.index("error: sidecar") :]
    assert error.startswith("error: sidecar 'main' could not start")
    assert f"cannot load model '{empty}'" in error
    assert not _tritonservers(tmp)
    assert not _workdirs(tmp)
