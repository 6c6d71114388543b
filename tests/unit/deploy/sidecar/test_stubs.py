"""Counting a tritonserver's Python stubs, and telling a dead one from an unloaded model."""

from __future__ import annotations

import shutil
from pathlib import Path

from deploy.sidecar.stubs import StubWatch, python_models, stub_models

SERVER = 100


class FakeProc:
    """A ``/proc`` with the processes a test puts there."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._next = 200

    def add(self, model: str, *, parent: int = SERVER, comm: str = "triton_python_b") -> int:
        pid = self._next
        self._next += 1
        entry = self.root / str(pid)
        entry.mkdir(parents=True)
        (entry / "stat").write_text(f"{pid} ({comm}) S {parent} {pid} {pid} 0 -1 4194560\n")
        argv = [
            "/opt/tritonserver/backends/python/triton_python_backend_stub",
            f"/repo/{model}/1/model.py",
            "tgw_shm",
        ]
        (entry / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        return pid

    def remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))


def test_stubs_are_counted_by_model_among_the_servers_children(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.add("bls")
    proc.add("bls")
    proc.add("pre")
    proc.add("other", parent=SERVER + 1)  # another server's stub
    proc.add("bash", comm="bash")  # not a stub
    (tmp_path / "self").mkdir()
    assert stub_models(SERVER, tmp_path) == {"bls": 2, "pre": 1}


def test_a_missing_stub_of_a_ready_model_is_named_on_the_second_check(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    engine = proc.add("engine")
    proc.add("pre")
    asked: list[str] = []

    def ready(model: str) -> bool:
        asked.append(model)
        return True

    watch = StubWatch(SERVER, ready, ["engine", "pre"], proc=tmp_path)
    assert watch.check() is None
    proc.remove(engine)
    assert watch.check() is None, "one short check may be a stub being started again"
    assert watch.check() == "engine"
    assert asked == ["engine"]


def test_a_stub_started_again_in_time_is_no_failure(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    engine = proc.add("engine")
    watch = StubWatch(SERVER, lambda model: True, ["engine"], proc=tmp_path)
    proc.remove(engine)
    assert watch.check() is None
    proc.add("engine")
    assert watch.check() is None
    assert watch.check() is None


def test_an_instance_seen_once_is_expected_from_then_on(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.add("bls")
    second = proc.add("bls")
    watch = StubWatch(SERVER, lambda model: True, ["bls"], proc=tmp_path)
    assert watch.check() is None
    proc.remove(second)
    watch.check()
    assert watch.check() == "bls"


def test_an_unloaded_model_lowers_what_is_expected(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    engine = proc.add("engine")
    watch = StubWatch(SERVER, lambda model: False, ["engine"], proc=tmp_path)
    proc.remove(engine)
    assert [watch.check() for _ in range(4)] == [None] * 4
    assert watch.expected["engine"] == 0


def test_a_model_whose_stub_was_gone_before_the_first_check_is_missed(tmp_path: Path) -> None:
    FakeProc(tmp_path).add("engine")
    watch = StubWatch(SERVER, lambda model: True, ["engine", "bls"], proc=tmp_path)
    watch.check()
    assert watch.check() == "bls"


def test_no_stub_of_the_server_in_sight_watches_nothing(tmp_path: Path) -> None:
    """A ``tritonserver`` that is a wrapper script: its stubs are not its children."""
    FakeProc(tmp_path).add("engine", parent=SERVER + 1)
    watch = StubWatch(SERVER, lambda model: True, ["engine"], proc=tmp_path)
    assert [watch.check() for _ in range(4)] == [None] * 4


def test_python_models_are_read_from_the_repository(tmp_path: Path) -> None:
    models = [
        ("pre", 'backend: "python"\n'),
        ("engine", 'backend: "tensorrtllm"\nmodel_transaction_policy {\n  decoupled: True\n}\n'),
        ("bls", 'backend: "python"\nmodel_transaction_policy {\n  decoupled: True\n}\n'),
        ("bls_once", 'backend: "python"\nmodel_transaction_policy {\n  decoupled: False\n}\n'),
        ("ensemble", 'platform: "ensemble"\n'),
    ]
    for name, config in models:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    assert python_models(tmp_path) == ["bls", "bls_once", "pre"]
