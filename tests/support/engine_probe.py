"""A sidecar's Python-backend stubs from the outside: an engine's CPU time (how tests see that a
generation really stopped), and what a stub loaded and runs in."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from deploy.sidecar.supervisor import Sidecar

TICKS = os.sysconf("SC_CLK_TCK")


class EngineProcess:
    """A model's Python-backend stub: its CPU time (a stopped engine thread sits idle), what it
    loaded, and the environment it runs in."""

    def __init__(self, sidecar: Sidecar, model: str) -> None:
        self.pid = _stub_pids(sidecar)[model]

    @classmethod
    def every(cls, sidecar: Sidecar) -> dict[str, EngineProcess]:
        """The stub of each Python model of the sidecar, by model name."""
        return {model: cls(sidecar, model) for model in _stub_pids(sidecar)}

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def mapped_files(self) -> set[str]:
        """The files mapped into the process (its shared libraries among them)."""
        lines = Path(f"/proc/{self.pid}/maps").read_text().splitlines()
        return {parts[5] for line in lines if len(parts := line.split(maxsplit=5)) == 6}

    def maps_torch(self) -> bool:
        """Whether libtorch is mapped into the process (it imported torch)."""
        return any("libtorch" in path for path in self.mapped_files())

    def environment(self) -> Path | None:
        """The virtual environment the process runs in (its ``VIRTUAL_ENV``), if any."""
        for item in Path(f"/proc/{self.pid}/environ").read_text().split("\0"):
            if item.startswith("VIRTUAL_ENV="):
                return Path(item.split("=", 1)[1])
        return None

    async def busy_seconds(self, window_s: float) -> float:
        before = self.cpu_seconds()
        await asyncio.sleep(window_s)
        return self.cpu_seconds() - before


def _stub_pids(sidecar: Sidecar) -> dict[str, int]:
    """Model name -> pid of its stub, among the sidecar's children (a stub's first argument is
    its ``<model>/<version>/model.py``)."""
    found = {}
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        script = Path(_argv1(pid))
        if script.name == "model.py" and _parent(pid) == sidecar.pid:
            found[script.parent.parent.name] = pid
    return found


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
