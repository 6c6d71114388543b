"""A text environment as ``deploy.devtools.offline install`` makes one: the gateway's runtime
packages without torch, this interpreter's numpy linked in. Python-backend models that need no
torch start in it without importing torch (transformers imports torch whenever it can)."""

from __future__ import annotations

import sys
from importlib.metadata import distribution
from pathlib import Path

from deploy.devtools.offline import _layer, _text_view, link_distribution, runtime_closure

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def make_text_env(root: Path) -> Path:
    """Build the environment under ``root``; its folder (an ``EXECUTION_ENV_PATH``)."""
    view = _text_view(root / "text-view", runtime_closure(VERSION))
    env = root / "text-env"
    site = _layer(env, [str(view)])
    link_distribution(distribution("numpy"), site)
    return env


def stub_processes(server_pid: int) -> dict[str, int]:
    """Model name -> pid of its Python-backend stub, among tritonserver's children."""
    found = {}
    for child in Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split():
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if argv[0].endswith(b"triton_python_backend_stub"):
            found[Path(argv[1].decode()).parent.parent.name] = int(child)
    return found


def environment_of(pid: int) -> Path | None:
    """The virtual environment a process runs in (its ``VIRTUAL_ENV``), if any."""
    for item in Path(f"/proc/{pid}/environ").read_text().split("\0"):
        if item.startswith("VIRTUAL_ENV="):
            return Path(item.split("=", 1)[1])
    return None


def maps_torch(pid: int) -> bool:
    """Whether a process has libtorch mapped (imported torch)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
