"""A model's stub process ends when its tritonserver is gone, even when Python cannot run.

The Python backend's stub notices a dead server and asks its interpreter to exit; a thread
blocked inside a call to the server while holding the GIL (a metric update or a response sent as
the server dies) keeps the interpreter from ever doing so, and the stub lives on as an orphan.
``ParentWatchdog`` arms ``faulthandler``'s timer, whose C thread needs no GIL, and a Python thread
re-arms it while the server lives: the process exits at once when the server is gone, and within
``timeout_s`` when no Python thread can run to re-arm it.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_PERIOD_S = 1.0


class ParentWatchdog:
    """Ends this process when its parent ends, or when Python stops running for ``timeout_s``."""

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        period_s: float = DEFAULT_PERIOD_S,
        parent: int | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.period_s = period_s
        self.parent = os.getppid() if parent is None else parent
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="parent-watchdog", daemon=True)
        # faulthandler writes the threads' tracebacks before it exits: to stderr where there is
        # one, else nowhere.
        stderr = sys.__stderr__
        self._file = stderr if stderr is not None else open(os.devnull, "w")  # noqa: SIM115

    def start(self) -> ParentWatchdog:
        """Arm the timer and start re-arming it."""
        self._arm()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Disarm: the process is ending on its own."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.period_s * 2)
        faulthandler.cancel_dump_traceback_later()

    def _arm(self) -> None:
        faulthandler.dump_traceback_later(self.timeout_s, exit=True, file=self._file)

    def _run(self) -> None:
        while not self._stopping.wait(self.period_s):
            if os.getppid() != self.parent:
                logger.error("the parent process %d is gone; this process exits", self.parent)
                os._exit(1)
            self._arm()
