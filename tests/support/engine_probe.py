"""The CPU time of a sidecar's engine process: how tests see that a generation really stopped."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from deploy.sidecar.supervisor import Sidecar


class EngineProcess:
    """A model's Python-backend stub: its CPU time (a stopped engine thread sits idle), and what it
    loaded."""

    def __init__(self, sidecar: Sidecar, model: str) -> None:
        suffix = f"/{model}/1/model.py"
        self.pid = next(
            pid
            for pid in (int(p) for p in os.listdir("/proc") if p.isdigit())
            if _parent(pid) == sidecar.pid and _argv1(pid).endswith(suffix)
        )
        self._tick = os.sysconf("SC_CLK_TCK")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self._tick

    def mapped_files(self) -> set[str]:
        """The files mapped into the process (its shared libraries among them)."""
        lines = Path(f"/proc/{self.pid}/maps").read_text().splitlines()
        return {parts[5] for line in lines if len(parts := line.split(maxsplit=5)) == 6}

    async def busy_seconds(self, window_s: float) -> float:
        before = self.cpu_seconds()
        await asyncio.sleep(window_s)
        return self.cpu_seconds() - before


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _argv1(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    return argv[1].decode(errors="replace") if len(argv) > 1 else ""
