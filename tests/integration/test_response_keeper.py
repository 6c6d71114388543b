"""The response keeper preloaded into tritonserver: a full ``evthr_defer`` command socket has its
send buffer grown and then makes the send wait for room instead of failing; every other send is
libc's; a sidecar runs with it and refuses to start when it is not loaded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from deploy.sidecar.frontend import keeper
from deploy.sidecar.supervisor import Sidecar, SidecarError
from deploy.sidecar.tritonbin import find_tritonserver
from tests.support.sidecars import QUICK_STOP

# Fills a non-blocking AF_UNIX socket pair with a small send buffer far past what it holds,
# while a reader starts draining it only after a while; prints what the sender saw.
SENDER = r"""
import json, os, socket, sys, threading, time

size, count, flags = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
writer, reader = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
writer.setblocking(False)
received = bytearray()

def drain():
    time.sleep(0.3)
    reader.settimeout(2.0)
    while len(received) < size * count:
        try:
            chunk = reader.recv(65536)
        except TimeoutError:
            return
        received.extend(chunk)

thread = threading.Thread(target=drain)
thread.start()
sent = 0
failure = None
for index in range(count):
    try:
        sent += writer.send(bytes([index % 251]) * size, flags)
    except BlockingIOError as exc:
        failure = type(exc).__name__
        break
thread.join()
expected = b"".join(bytes([i % 251]) * size for i in range(sent // size))
sndbuf = writer.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
print(json.dumps({"sent": sent, "failure": failure, "whole": bytes(received) == expected,
                  "sndbuf": sndbuf, "preload": os.environ.get("LD_PRELOAD")}))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if keeper.compiler() is None:
        pytest.skip("no C compiler on this host: the response keeper cannot be built")
    library = keeper.build(tmp_path_factory.mktemp("keeper"))
    assert library is not None, "the response keeper did not build (the log says why)"
    return library


def _send(
    size: int,
    count: int,
    preload: Path | None,
    flags: int = 0,
    after: str | None = None,
    name: str = "python",
) -> dict[str, object]:
    """Run ``SENDER`` as a process called ``name`` (its ``argv[0]``)."""
    env = {**os.environ}
    if preload is not None:
        env["LD_PRELOAD"] = keeper.preload_value(preload, after)
    done = subprocess.run(
        [name, "-c", SENDER, str(size), str(count), str(flags)],
        executable=sys.executable,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


COMMANDS = 40_000
"""More commands than a send buffer grown to the keeper's 8 MiB holds (about 10,900)."""


def _wmem_max() -> int:
    return int(Path("/proc/sys/net/core/wmem_max").read_text())


def test_a_full_command_socket_fails_the_send_without_the_keeper() -> None:
    result = _send(17, COMMANDS, preload=None)
    assert result["failure"] == "BlockingIOError"
    assert isinstance(result["sent"], int) and result["sent"] < 17 * COMMANDS
    assert result["sndbuf"] == 2 * 4096


def test_the_keeper_grows_the_buffer_then_waits_and_every_command_arrives_in_order(
    built: Path,
) -> None:
    result = _send(17, COMMANDS, preload=built)
    grown = 2 * min(_wmem_max(), 8 * 1024 * 1024)
    assert result == {
        "sent": 17 * COMMANDS,
        "failure": None,
        "whole": True,
        "sndbuf": grown,
        "preload": str(built),
    }


def test_tritonserver_starts_its_processes_without_the_keeper(built: Path) -> None:
    # A launcher (setpriv) passes it on to the tritonserver it execs; tritonserver does not.
    launcher = _send(17, 1, preload=built, after="libc.so.6")
    assert launcher["preload"] == f"{built}:libc.so.6"
    server = _send(17, 1, preload=built, after="libc.so.6", name="tritonserver")
    assert server["preload"] == "libc.so.6"
    assert _send(17, 1, preload=built, name="tritonserver")["preload"] is None


def test_other_sends_are_left_to_libc(built: Path) -> None:
    other = _send(16, COMMANDS, preload=built)
    assert other["failure"] == "BlockingIOError"
    assert other["sndbuf"] == 2 * 4096
    dontwait = _send(17, COMMANDS, preload=built, flags=0x40)  # MSG_DONTWAIT
    assert dontwait["failure"] == "BlockingIOError"


def test_build_is_cached_and_the_preload_keeps_what_was_there(built: Path) -> None:
    assert keeper.build(built.parent) == built
    assert keeper.preload_value(built, None) == str(built)
    assert keeper.preload_value(built, "/lib/other.so") == f"{built}:/lib/other.so"


def test_the_shared_sidecar_runs_with_the_keeper(sidecar: Sidecar, built: Path) -> None:
    assert sidecar.keeper is not None and sidecar.keeps_responses
    assert sidecar.pid is not None and keeper.loaded_by(sidecar.pid, sidecar.keeper)
    stubs = psutil.Process(sidecar.pid).children(recursive=True)
    assert stubs, "the Python backend's stubs"
    assert not any(keeper.loaded_by(stub.pid, sidecar.keeper) for stub in stubs)


def _empty_sidecar(name: str, folder: Path, library: Path, **options: Any) -> Sidecar:
    """A tritonserver serving an empty repository in ``folder``, ``library`` as its keeper."""
    (folder / "repo").mkdir()
    return Sidecar(
        name,
        folder / "repo",
        find_tritonserver(),
        keeper=library,
        startup_timeout_s=120,
        log_path=folder / f"{name}.log",
        **QUICK_STOP,
        **options,
    )


def test_a_sidecar_that_did_not_load_the_keeper_does_not_start(tmp_path: Path) -> None:
    broken = tmp_path / "keep-responses.so"
    broken.write_text("not a shared object\n")
    other = _empty_sidecar("nokeeper", tmp_path, broken)
    with pytest.raises(SidecarError, match="did not load the response keeper"):
        other.start()
    assert other.pid is None


def test_a_home_that_cannot_be_written_keeps_it_in_a_private_temporary_folder(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setattr(keeper, "cache_folder", lambda: blocked / "triton-gateway")
    monkeypatch.setattr(keeper, "fallback_folder", lambda: tmp_path / "private")
    library = keeper.build()
    assert library is not None and library.parent == tmp_path / "private"
    assert library.name == built.name
    assert (tmp_path / "private").stat().st_mode & 0o077 == 0


def test_a_folder_others_may_write_to_is_never_used(built: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / built.name).write_bytes(built.read_bytes())
    shared.chmod(0o777)
    assert keeper.build(shared) is None


def test_a_cached_keeper_behind_a_symbolic_link_is_never_used(built: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (real / built.name).write_bytes(built.read_bytes())
    (tmp_path / "linked").symlink_to(real)
    assert keeper._private(real / built.name)
    assert not keeper._private(tmp_path / "linked")
    assert keeper.build(tmp_path / "linked") is None


def test_a_restart_that_did_not_load_the_keeper_gives_the_sidecar_up(
    built: Path, tmp_path: Path
) -> None:
    library = tmp_path / "keep-responses.so"
    library.write_bytes(built.read_bytes())
    server = _empty_sidecar("restarted", tmp_path, library, max_restarts=2, backoff_s=(0.1, 0.1))
    server.start()
    try:
        library.unlink()  # the loader then starts tritonserver without it, saying so
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        assert server.failed.wait(60), "a restart without the keeper is given up"
        assert "did not load the response keeper" in (server._failed or "")
        assert server.pid is None
    finally:
        server.stop()


def test_a_server_killed_as_it_answered_ready_is_an_exit_not_a_missing_keeper(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher saw "ready", then the process died before its maps were read: it is
    restarted like any other exit, not given up as a server that runs without the keeper."""
    server = _empty_sidecar("killed", tmp_path, built)
    process = subprocess.Popen(["sleep", "60"])

    def ready_then_killed(timeout: float = 2.0) -> bool:
        process.kill()
        return True

    monkeypatch.setattr(server, "is_ready", ready_then_killed)
    try:
        assert server._watch(process) == (True, None)
        assert not server.failed.is_set() and server._failed is None
    finally:
        process.kill()
        process.wait()


def test_a_keeper_built_against_another_c_library_is_not_taken(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache folder shared with a host or image of another C library gets a keeper of its
    own there (its name differs), never the one built here."""
    monkeypatch.setattr(keeper.os, "confstr", lambda name: "glibc 1.0")
    other = keeper.build(built.parent)
    assert other is not None and other != built
    assert other.parent == built.parent and other.exists()
    monkeypatch.undo()
    assert keeper.build(built.parent) == built
