"""The sidecar supervisor: command lines, start-up failures, restarts and clean shutdown."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import psutil
import pytest

from deploy.sidecar.fleet import sidecar_from_spec, start_all, stop_all
from deploy.sidecar.ports import PORT_FLOOR, free_port
from deploy.sidecar.render import RenderError
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.stubs import stub_models
from deploy.sidecar.supervisor import Sidecar, SidecarError
from deploy.sidecar.tritonbin import (
    ServerArgs,
    TritonBinary,
    build_command,
    find_tritonserver,
    orchestrator_env,
    parse_gpu_ids,
)
from tests.support.sidecars import QUICK_STOP

ARGS = ServerArgs(Path("/repo"), "127.0.0.1", 1, 2, 3, "p_")


def test_command_binds_loopback_on_given_ports() -> None:
    cmd = build_command(TritonBinary(Path("/bin/ts"), Path("/be")), ARGS)
    assert cmd[0] == "/bin/ts"
    for flag in (
        "--model-repository=/repo",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--http-port=1",
        "--grpc-port=2",
        "--metrics-port=3",
        "--backend-directory=/be",
        "--backend-config=python,shm-region-prefix-name=p_",
        "--backend-config=python,stub-timeout-seconds=300",
    ):
        assert flag in cmd
    assert not any(c.startswith("--cuda-memory-pool") for c in cmd)


def test_orchestrator_command_mirrors_launch_script() -> None:
    args = ServerArgs(Path("/repo"), "127.0.0.1", 1, 2, 3, "p_", orchestrator_gpus=(0, 1, 2))
    cmd = build_command(TritonBinary(Path("/opt/tritonserver/bin/tritonserver")), args)
    assert "--disable-auto-complete-config" in cmd
    assert "--enable-peer-access=false" in cmd
    assert "--pinned-memory-pool-byte-size=0" in cmd
    assert [c for c in cmd if c.startswith("--cuda-memory-pool")] == [
        "--cuda-memory-pool-byte-size=0:0",
        "--cuda-memory-pool-byte-size=1:0",
        "--cuda-memory-pool-byte-size=2:0",
    ]
    assert not any(c.startswith("--backend-directory") for c in cmd)
    assert orchestrator_env() == {
        "TRTLLM_ORCHESTRATOR": "1",
        "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1",
    }


@pytest.mark.parametrize(
    ("value", "ids"), [(None, ()), ("0", (0,)), ("0,1", (0, 1)), ("2,3;0,1", (0, 1, 2, 3))]
)
def test_parse_gpu_ids(value: str | None, ids: tuple[int, ...]) -> None:
    assert parse_gpu_ids(value) == ids


def test_tensorrtllm_sidecar_uses_orchestrator_mode(tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    (tmp_path / "tok").mkdir()
    fake = tmp_path / "tritonserver"
    fake.write_text("#!/bin/sh\n")
    spec = parse_spec(
        {
            "models": [
                {
                    "name": "a",
                    "tokenizer_dir": str(tmp_path / "tok"),
                    "engine": {
                        "kind": "tensorrtllm",
                        "engine_dir": str(tmp_path / "engine"),
                        "gpu_device_ids": "0,1",
                    },
                },
                {
                    "name": "b",
                    "tokenizer_dir": str(tmp_path / "tok"),
                    "engine": {
                        "kind": "tensorrtllm",
                        "engine_dir": str(tmp_path / "engine"),
                        "gpu_device_ids": "2",
                    },
                },
            ],
            "sidecars": [{"name": "gpu", "tritonserver": str(fake)}],
        }
    )
    sidecar = sidecar_from_spec(spec, spec.sidecars[0], tmp_path / "work")
    assert sidecar.command[0] == str(fake)
    assert "--cuda-memory-pool-byte-size=2:0" in sidecar.command
    assert sidecar._env["TRTLLM_ORCHESTRATOR"] == "1"
    assert (sidecar.repository / "a_tensorrt_llm" / "config.pbtxt").is_file()
    assert (sidecar.repository / "b_tensorrt_llm" / "config.pbtxt").is_file()


def test_missing_model_dir_fails_fast(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    spec = parse_spec(
        {"models": [{"name": "m", "engine": {"kind": "torch", "model_dir": str(missing)}}]}
    )
    started = time.monotonic()
    with pytest.raises(RenderError, match=str(missing)):
        start_all(spec, tmp_path / "work")
    assert time.monotonic() - started < 30  # a sidecar started first would wait for minutes


def _tritonservers() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline", "ppid"]):
        if proc.info["name"] == "tritonserver" and proc.info["ppid"] == os.getpid():
            found.append(proc)
    return found


@pytest.mark.slow
def test_model_that_fails_to_load_reports_log_tail(tiny_model_dir: Path, tmp_path: Path) -> None:
    spec = parse_spec(
        {
            "models": [
                {
                    "name": "broken",
                    "tokenizer_dir": str(tiny_model_dir),
                    "engine": {"kind": "torch", "model_dir": "no-such-org/no-such-model"},
                }
            ],
            "sidecars": [{"env": {"HF_HUB_OFFLINE": "1"}, "startup_timeout_s": 120}],
        }
    )
    sidecar = sidecar_from_spec(spec, spec.sidecars[0], tmp_path)
    with pytest.raises(SidecarError, match="exited with code") as info:
        sidecar.start()
    assert "broken_tensorrt_llm" in str(info.value)
    assert "errors logged" in str(info.value)
    assert "no-such-org/no-such-model" in sidecar.error_lines()
    assert sidecar.pid is None


def test_a_sidecar_port_is_free_and_outside_the_ephemeral_range() -> None:
    """Outgoing connections take local ports from the ephemeral range; a sidecar's port must
    not be one of them, or a connection could take it while the sidecar restarts."""
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if ephemeral - PORT_FLOOR < 1000:
        pytest.skip(f"the ephemeral range starts at {ephemeral}: sidecar ports come from it")
    picked = [free_port() for _ in range(200)]
    ports = set(picked)
    assert len(ports) == len(picked), "a port was handed out twice"
    assert all(PORT_FLOOR <= port < ephemeral for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_stub_may_initialize_for_as_long_as_the_sidecar_may_start(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The Python backend's own 30 s for a stub to initialize would hang a server whose model
    loads longer; a sidecar gives its stubs its whole startup timeout."""
    spec = parse_spec(
        {
            "models": [_load_test_pipeline("tiny", tiny_model_dir)],
            "sidecars": [{"startup_timeout_s": 45.5}],
        }
    )
    sidecar = sidecar_from_spec(spec, spec.sidecars[0], tmp_path)
    cmd = build_command(find_tritonserver(), sidecar._args)
    assert "--backend-config=python,stub-timeout-seconds=46" in cmd


def _load_test_pipeline(name: str, tokenizer: Path) -> dict[str, object]:
    """A pipeline whose engine is the load-test model: what supervision sees, started quickly."""
    return {"name": name, "engine": {"kind": "loadtest", "tokenizer_dir": str(tokenizer)}}


@pytest.mark.slow
def test_restart_after_kill_and_clean_stop(tiny_model_dir: Path, tmp_path: Path) -> None:
    spec = parse_spec({"models": [_load_test_pipeline("tiny", tiny_model_dir)]})
    [sidecar] = start_all(spec, tmp_path)
    try:
        first = psutil.Process(sidecar.pid)
        stubs = first.children(recursive=True)
        assert stubs, "the Python-backend stubs run as children of tritonserver"
        os.kill(first.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while sidecar.is_ready() and time.monotonic() < deadline:
            time.sleep(0.1)
        sidecar.wait_ready(240)
        assert sidecar.restarts == 1
        assert [(e.code, e.reason) for e in sidecar.exits] == [
            (-signal.SIGKILL, "tritonserver exited with code -9")
        ]
        assert sidecar.pid is not None and sidecar.pid != first.pid
        assert not any(p.is_running() and p.status() != "zombie" for p in stubs)
        second = psutil.Process(sidecar.pid)
        children = second.children(recursive=True)
    finally:
        stop_all([sidecar])
    assert sidecar.pid is None
    _, alive = psutil.wait_procs([second, *children], timeout=15)
    assert not alive
    assert not list(Path("/dev/shm").glob(f"{sidecar._args.shm_prefix}*"))
    # Stopped gracefully: every model unloaded, no stub crashed on its way out.
    log = sidecar.log_path.read_text(errors="replace")
    assert "successfully unloaded 'tiny_tensorrt_llm'" in log
    assert "Segfault" not in log and "ignored SIGTERM" not in log


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny_tensorrt_llm", "tiny_preprocessing"])
def test_a_dead_python_stub_restarts_tritonserver(
    tiny_model_dir: Path, tmp_path: Path, model: str
) -> None:
    """Triton keeps calling a model whose stub died ready, fails its every request and never
    starts the stub again, decoupled (the engine) or not (the preprocessing); the supervisor
    notices the missing stub and starts tritonserver again."""
    spec = parse_spec({"models": [_load_test_pipeline("tiny", tiny_model_dir)]})
    [sidecar] = start_all(spec, tmp_path)
    try:
        first = sidecar.pid
        assert first is not None
        before = stub_models(first)
        assert before["tiny_tensorrt_llm"] == 1 and before["tiny_preprocessing"] >= 1
        stub = next(
            p for p in psutil.Process(first).children() if f"/{model}/" in " ".join(p.cmdline())
        )
        stub.kill()
        deadline = time.monotonic() + 30
        while sidecar.restarts == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sidecar.restarts == 1, "the supervisor did not notice the dead stub"
        sidecar.wait_ready(240)
        assert sidecar.pid not in (None, first)
        assert stub_models(sidecar.pid or 0) == before
        [gone] = sidecar.exits
        assert gone.code == -signal.SIGKILL
        assert f"stub of model {model} died" in gone.reason
        assert f"--- sidecar main: the Python stub of model {model} died" in (
            sidecar.log_path.read_text(errors="replace")
        )
    finally:
        stop_all([sidecar])


@pytest.mark.slow
def test_two_sidecars_at_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    spec = parse_spec(
        {
            "models": [
                _load_test_pipeline("left", tiny_model_dir),
                _load_test_pipeline("right", tiny_model_dir),
            ],
            "sidecars": [
                {"name": "one", "models": ["left"], **QUICK_STOP},
                {"name": "two", "models": ["right"], **QUICK_STOP},
            ],
        }
    )
    sidecars: list[Sidecar] = start_all(spec, tmp_path)
    try:
        assert len({s.grpc_port for s in sidecars}) == 2
        assert all(s.is_ready() for s in sidecars)
        assert len(_tritonservers()) >= 2
    finally:
        stop_all(sidecars)
    assert all(s.pid is None for s in sidecars)


def test_find_tritonserver_rejects_missing_binary(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="does not exist"):
        find_tritonserver(str(tmp_path / "nope"))


def test_pytriton_binary_and_stub_are_found() -> None:
    binary = find_tritonserver()
    assert binary.path.is_file()
    assert binary.backend_directory is not None
    assert (binary.backend_directory / "python" / "triton_python_backend_stub").is_file()
    assert binary.env["PATH"].split(os.pathsep)[0].endswith("bin")
