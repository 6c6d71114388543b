"""The response keeper: a library preloaded into tritonserver so that its HTTP frontend waits for
room instead of losing a ``generate_stream`` response (``keep_responses.c`` says how).

It is compiled from source on this host, once per source, with the C compiler of ``$CC`` or
``cc``, into the user's cache folder; a host without a compiler has none (``build`` says why in
the log) and a sidecar there keeps Triton's behaviour.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("keep_responses.c")
COMPILE_TIMEOUT_S = 120.0


def cache_folder() -> Path:
    """Where built keepers are kept: ``$XDG_CACHE_HOME/triton-gateway`` or
    ``~/.cache/triton-gateway``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "triton-gateway"


def compiler() -> str | None:
    """The C compiler keepers are built with: ``$CC``, else ``cc`` or ``gcc`` on the PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(folder: Path | None = None) -> Path | None:
    """The keeper built for this host (built now if the cache has none); None where it cannot
    be built."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + platform.machine().encode()).hexdigest()[:16]
    target = (folder or cache_folder()) / f"keep-responses-{digest}.so"
    if target.is_file():
        return target
    cc = compiler()
    if cc is None:
        logger.warning("the response keeper cannot be built: no C compiler ($CC, cc or gcc)")
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            staging = Path(scratch) / target.name
            command = [cc, "-O2", "-shared", "-fPIC", "-o", str(staging), str(SOURCE), "-ldl"]
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False
            )
            if done.returncode != 0:
                logger.warning(
                    "the response keeper could not be built (%s): %s",
                    " ".join(command),
                    done.stderr.strip(),
                )
                return None
            os.replace(staging, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("the response keeper could not be built in %s: %s", target.parent, exc)
        return None
    return target


def preload_value(keeper: Path, current: str | None) -> str:
    """``LD_PRELOAD`` with the keeper first and what was there kept after it."""
    return ":".join([str(keeper), *([current] if current else [])])


def loaded_by(pid: int, keeper: Path) -> bool:
    """Whether the process ``pid`` has the keeper mapped (``/proc/<pid>/maps``)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
    return str(keeper.resolve()) in maps
