"""A sidecar dies with the process that supervises it, however that process ends."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from deploy.sidecar import parentdeath

PARENT = textwrap.dedent(
    """
    import subprocess, sys, threading, time
    from deploy.sidecar import parentdeath

    if sys.argv[1] == "preexec":
        parentdeath._setpriv = lambda: None

    def spawn():
        command, preexec = parentdeath.dying_with_parent(["sleep", "120"])
        child = subprocess.Popen(command, preexec_fn=preexec, start_new_session=True)
        print(child.pid, flush=True)
        time.sleep(600)

    threading.Thread(target=spawn, daemon=True).start()
    time.sleep(600)
    """
)


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _kill_and_outlive(parent: subprocess.Popen[str], child: psutil.Process, why: str) -> None:
    """SIGKILL ``parent``; ``child`` must be gone within 10 s."""
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


@pytest.mark.parametrize("way", ["setpriv", "preexec"])
def test_the_child_gets_sigterm_when_its_supervisor_is_killed(way: str) -> None:
    if way == "setpriv" and parentdeath._setpriv() is None:
        pytest.skip("no setpriv with --pdeathsig on this machine")
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, way], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        # The child is sleep itself (setpriv execs it), not a wrapper that outlives the signal.
        deadline = time.monotonic() + 10
        while child.name() != "sleep":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert _alive(child)
        _kill_and_outlive(parent, child, "the child outlived its supervisor")
    finally:
        parent.kill()
        parent.wait()


def test_without_setpriv_the_command_is_unchanged_and_prctl_runs_in_the_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(parentdeath, "_setpriv", lambda: None)
    command, preexec = parentdeath.dying_with_parent(["tritonserver", "--model-repository=/m"])
    assert command == ["tritonserver", "--model-repository=/m"]
    assert preexec is parentdeath._die_with_parent


EMBEDDED = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from gateway.workers.redis import EmbeddedRedis

    redis = EmbeddedRedis(Path(sys.argv[1])).start()
    print(redis._process.pid, flush=True)
    time.sleep(600)
    """
)


def test_the_embedded_redis_exits_when_its_gateway_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", EMBEDDED, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        server = psutil.Process(int(parent.stdout.readline()))
        assert "redis-server" in server.name() and _alive(server)
        _kill_and_outlive(parent, server, "the embedded redis-server outlived its gateway")
    finally:
        parent.kill()
        parent.wait()
