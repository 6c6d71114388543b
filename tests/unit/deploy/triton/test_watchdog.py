"""The stub's watchdog, in real processes: it ends one whose Python cannot run any more and one
whose parent is gone, and leaves a healthy one alone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]


def python(code: str, **options: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **options,  # type: ignore[call-overload]
    )


def test_a_process_whose_gil_is_held_forever_exits() -> None:
    # A call through ctypes.PyDLL keeps the GIL, as a call into the server that never returns
    # does: no Python thread runs again, and only the armed timer can end the process.
    child = python(
        """
        import ctypes
        from deploy.triton.watchdog import ParentWatchdog
        ParentWatchdog(timeout_s=1.0, period_s=0.1).start()
        print("armed", flush=True)
        ctypes.PyDLL(None).sleep(60)
        print("slept", flush=True)
        """
    )
    started = time.monotonic()
    out, err = child.communicate(timeout=30)
    assert out.strip() == "armed"
    assert child.returncode == 1
    assert time.monotonic() - started < 20
    assert "Timeout" in err


def test_a_healthy_process_outlives_the_timeout() -> None:
    child = python(
        """
        import time
        from deploy.triton.watchdog import ParentWatchdog
        dog = ParentWatchdog(timeout_s=0.5, period_s=0.1).start()
        time.sleep(2.0)
        dog.stop()
        time.sleep(1.0)
        print("done", flush=True)
        """
    )
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert out.strip() == "done"


@pytest.mark.parametrize(
    "rest",
    [
        "time.sleep(60)",
        # Its main code done, the interpreter waits at exit for a thread that never ends (a
        # model's finalize returned with one of its threads stuck).
        "threading.Thread(target=time.sleep, args=(60,)).start()",
    ],
    ids=["running", "exiting"],
)
def test_a_process_whose_parent_is_gone_exits(tmp_path: Path, rest: str) -> None:
    pid_file = tmp_path / "pid"
    # The middle process starts the watched one, and exits once it is watching.
    middle = python(
        f"""
        import os, subprocess, sys, time
        from pathlib import Path
        code = '''
        import threading, time
        from pathlib import Path
        from deploy.triton.watchdog import ParentWatchdog
        ParentWatchdog(timeout_s=60.0, period_s=0.1).start()
        Path({str(pid_file)!r}).write_text(str(os.getpid()))
        {rest}
        '''.replace("\\n        ", "\\n")
        subprocess.Popen([sys.executable, "-c", "import os\\n" + code], env=os.environ,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not Path({str(pid_file)!r}).exists():
            time.sleep(0.02)
        """
    )
    middle.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the watched process never started"
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} outlived its parent"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
