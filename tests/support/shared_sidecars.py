"""The session's shared sidecar between tests: back to serving before the next test when it
restarted, and every unplanned exit told at the very end of the run.

A tritonserver that crashes fails the test that was using it. The supervisor starts it again,
and the tests after it wait for that rather than failing one after another while it loads. What
happened is printed after pytest's summary (from every xdist worker): the exit code, the test
during or after which it happened, and the server's last log lines before it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from deploy.sidecar.supervisor import Sidecar

EXITS_DIR_ENV = "TGW_TEST_SIDECAR_EXITS"
"""Where every process of the run writes the exits it saw (set by the controlling process,
inherited by xdist's workers)."""
_OWNS_EXITS_DIR = pytest.StashKey[bool]()


class SharedSidecars:
    """The shared sidecars of this process, and what they went through."""

    def __init__(self) -> None:
        self._seen: dict[Sidecar, int] = {}
        self._last_test = "(before any test)"

    def add(self, sidecar: Sidecar) -> None:
        self._seen[sidecar] = len(sidecar.exits)

    def remove(self, sidecar: Sidecar) -> None:
        self._note_exits(sidecar)
        self._seen.pop(sidecar, None)

    def before_test(self, nodeid: str, uses_sidecar: bool) -> None:
        """Before a test that uses a shared sidecar: wait for one that exited since the last
        test to serve again (one that will not, the supervisor gave up, fails the test)."""
        if uses_sidecar:
            for sidecar in list(self._seen):
                if sidecar.pid is None or len(sidecar.exits) != self._seen[sidecar]:
                    try:
                        sidecar.wait_ready(sidecar.startup_timeout_s)
                    finally:
                        self._note_exits(sidecar)
        self._last_test = nodeid

    def _note_exits(self, sidecar: Sidecar) -> None:
        """Write the exits not told yet where the controlling process reads them."""
        told = [
            f"sidecar {sidecar.name}: {gone.reason}, during or after {self._last_test}; "
            f"its log before that:\n{gone.log_tail}"
            for gone in sidecar.exits[self._seen.get(sidecar, 0) :]
        ]
        self._seen[sidecar] = len(sidecar.exits)
        where = os.environ.get(EXITS_DIR_ENV)
        if told and where is not None:
            with (Path(where) / f"{os.getpid()}.txt").open("a") as out:
                out.write("\n".join(told) + "\n")


def controller_configure(config: pytest.Config) -> None:
    """In the controlling process: a folder where every process writes what it saw."""
    if hasattr(config, "workerinput") or EXITS_DIR_ENV in os.environ:
        return
    os.environ[EXITS_DIR_ENV] = tempfile.mkdtemp(prefix="tgw-sidecar-exits-")
    config.stash[_OWNS_EXITS_DIR] = True


def controller_report(config: pytest.Config) -> None:
    """In the controlling process, after pytest's summary: the exits, if any."""
    if not config.stash.get(_OWNS_EXITS_DIR, False):
        return
    where = os.environ.pop(EXITS_DIR_ENV, None)
    if where is None:
        return
    reports = sorted(Path(where).glob("*.txt"))
    text = "".join(report.read_text() for report in reports)
    for report in reports:
        report.unlink()
    os.rmdir(where)
    if not text:
        return
    writer = config.get_terminal_writer()
    writer.sep("=", "shared sidecars that exited during the run", red=True)
    writer.line(text.rstrip())
