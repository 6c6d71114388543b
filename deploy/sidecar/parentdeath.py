"""A child process that gets SIGTERM when the thread that started it dies (PR_SET_PDEATHSIG):
tritonserver does not outlive the gateway or test run that supervised it, however that ended."""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import subprocess
from collections.abc import Callable


def _load_libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


# Loaded here, not in the forked child, where dlopen could deadlock on the loader lock.
_LIBC = _load_libc()


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the supervising thread's process dies."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@functools.cache
def _setpriv() -> str | None:
    """util-linux ``setpriv`` if it can set the parent-death signal, else None.

    Exec'd through it, the child sets PDEATHSIG without running Python after fork: in a process
    with gRPC and torch threads, fork handlers and a Python ``preexec_fn`` can abort the child.
    """
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        probe = subprocess.run(
            [path, "--pdeathsig", "TERM", "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return path if probe.returncode == 0 else None


def dying_with_parent(command: list[str]) -> tuple[list[str], Callable[[], None] | None]:
    """``command`` and the ``preexec_fn`` that make it get SIGTERM when its parent thread dies."""
    setpriv = _setpriv()
    if setpriv is not None:
        return [setpriv, "--pdeathsig", "TERM", "--", *command], None
    return command, _die_with_parent


def follow_parent(parent_pid: int) -> bool:
    """In a started process: get SIGTERM when ``parent_pid``, the process (and thread) that
    started this one, dies. ``False`` when it has died already, before the signal was set."""
    _die_with_parent()
    return os.getppid() == parent_pid
