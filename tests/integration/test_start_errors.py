"""`triton-gateway serve` with a configuration that cannot work: one line naming the field and
what to do, exit code 2, no traceback unless --debug asks for it."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

COMMAND = str(Path(sys.executable).parent / "triton-gateway")
SETTINGS = "sidecars: {spec: ./deploy.yaml}\ntenancy: {auth: false}\n"


def _spec(model_dir: str) -> str:
    return f"models:\n  - name: m\n    engine: {{kind: torch, model_dir: {model_dir}}}\n"


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serve(folder: Path, *extra: str, port: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMMAND, "serve", "--config", str(folder / "gateway.yaml"),
         "--port", str(port or _unused_port()), *extra],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _write(folder: Path, settings: str, spec: str | None) -> Path:
    (folder / "gateway.yaml").write_text(settings)
    if spec is not None:
        (folder / "deploy.yaml").write_text(spec)
    return folder


@pytest.mark.parametrize(
    ("settings", "spec", "names"),
    [
        (
            SETTINGS,
            _spec("./no-such-model"),
            ["engine.model_dir", "no-such-model", "does not exist"],
        ),
        (SETTINGS, _spec("./empty"), ["engine.model_dir", "is empty"]),
        (SETTINGS, None, ["sidecars.spec", "deploy.yaml", "does not exist"]),
    ],
    ids=["missing model folder", "empty model folder", "missing deploy spec"],
)
def test_a_folder_or_file_that_is_not_there_is_one_line(
    tmp_path: Path, settings: str, spec: str | None, names: list[str]
) -> None:
    (tmp_path / "empty").mkdir()
    served = _serve(_write(tmp_path, settings, spec))
    assert served.returncode == 2, served.stderr
    lines = served.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), served.stderr
    assert all(name in lines[0] for name in names), lines[0]
    assert "Traceback" not in served.stdout + served.stderr


def test_a_missing_adapter_folder_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    settings = (
        "models:\n  - {name: m, triton_url: 127.0.0.1:1, tokenizer_dir: ./tokenizer,\n"
        "     adapters: [{name: sql, path: ./adapters/sql}]}\ntenancy: {auth: false}\n"
    )
    served = _serve(_write(tmp_path, settings, None))
    assert served.returncode == 2, served.stderr
    lines = served.stderr.strip().splitlines()
    assert len(lines) == 1 and "adapters 'sql': path" in lines[0], served.stderr


def test_a_port_in_use_is_one_line(tmp_path: Path, held_port: int) -> None:
    served = _serve(_write(tmp_path, "tenancy: {auth: false}\n", None), port=held_port)
    assert served.returncode == 2, served.stderr
    lines = served.stderr.strip().splitlines()
    assert len(lines) == 1 and "server.port" in lines[0] and str(held_port) in lines[0]
    assert "Traceback" not in served.stdout + served.stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    served = _serve(_write(tmp_path, SETTINGS, _spec("./no-such-model")), "--debug")
    assert served.returncode != 0
    assert "Traceback" in served.stderr and "engine.model_dir" in served.stderr
