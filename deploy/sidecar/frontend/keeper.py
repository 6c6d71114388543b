"""The response keeper: a library preloaded into tritonserver so that its HTTP frontend waits for
room instead of losing a ``generate_stream`` response (``keep_responses.c`` says how).

It is compiled from source on this host, once per source and C library, with the C compiler of
``$CC`` or ``cc``, into the gateway's cache folder; a host without a compiler has none (``build``
says why in the log) and a sidecar there keeps Triton's behaviour.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from deploy.sidecar.models import cache_root

logger = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("keep_responses.c")
COMPILE_TIMEOUT_S = 120.0


def cache_folder() -> Path:
    """Where built keepers are kept: the gateway's cache folder (``$TRITON_GATEWAY_CACHE``,
    default ``~/.cache/triton-gateway``)."""
    return cache_root()


def compiler() -> str | None:
    """The C compiler keepers are built with: ``$CC``, else ``cc`` or ``gcc`` on the PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(folder: Path | None = None) -> Path | None:
    """The keeper built for this host (built now if the cache has none); None where it cannot
    be built. Without ``folder``, the cache folder, else a private one in the temporary folder
    (a home that cannot be written, as in a container with a read-only root)."""
    name = f"keep-responses-{_digest(SOURCE.read_bytes())}.so"
    folders = [folder] if folder else [cache_folder(), fallback_folder()]
    for where in folders:
        target = where / name
        if _private(where) and _private(target):
            return target
    cc = compiler()
    if cc is None:
        logger.warning("the response keeper cannot be built: no C compiler ($CC, cc or gcc)")
        return None
    for where in folders:
        try:
            where.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            logger.info("the response keeper cannot be kept in %s: %s", where, exc)
            continue
        if not _private(where):
            logger.warning(
                "%s is not this user's alone: the response keeper is not kept there", where
            )
            continue
        try:
            return _compile(cc, where / name)
        except OSError as exc:
            logger.info("the response keeper could not be built in %s: %s", where, exc)
    logger.warning("the response keeper could not be built in %s", ", ".join(map(str, folders)))
    return None


def _digest(source: bytes) -> str:
    """What a built keeper depends on: its source, the machine and the C library it was built
    against (a cache folder shared by hosts or images of other C libraries builds its own)."""
    libc = ""
    with contextlib.suppress(ValueError, OSError):
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    if not libc:
        libc = " ".join(platform.libc_ver())
    key = b"\0".join([source, platform.machine().encode(), libc.encode()])
    return hashlib.sha256(key).hexdigest()[:16]


def fallback_folder() -> Path:
    """``triton-gateway-<uid>`` in the temporary folder."""
    return Path(tempfile.gettempdir()) / f"triton-gateway-{os.getuid()}"


def _private(path: Path) -> bool:
    """Whether ``path`` is this user's own folder or file, not a symbolic link, and only this
    user may write to it (a library in it is preloaded into tritonserver)."""
    try:
        status = path.lstat()
    except OSError:
        return False
    if stat.S_ISLNK(status.st_mode):
        return False
    return status.st_uid == os.getuid() and not status.st_mode & 0o022


def _compile(cc: str, target: Path) -> Path | None:
    """Compile into ``target`` (atomically); None, with the compiler's words logged, if it
    failed."""
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        staging = Path(scratch) / target.name
        command = [*shlex.split(cc), "-O2", "-shared", "-fPIC", "-o", str(staging), str(SOURCE)]
        command.append("-ldl")
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            logger.warning("the response keeper's build took over %.0f s", COMPILE_TIMEOUT_S)
            return None
        if done.returncode != 0:
            logger.warning(
                "the response keeper could not be built (%s): %s",
                " ".join(command),
                done.stderr.strip(),
            )
            return None
        os.replace(staging, target)
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
