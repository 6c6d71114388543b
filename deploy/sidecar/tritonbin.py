"""Locate a tritonserver binary and build its command line and environment."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path


class TritonNotFound(RuntimeError):
    """No usable tritonserver binary."""


@dataclass(frozen=True)
class TritonBinary:
    """A tritonserver executable, its backends folder and the environment it needs."""

    path: Path
    backend_directory: Path | None = None
    env: dict[str, str] = field(default_factory=dict)


def _pytriton_root() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonNotFound(
            "no tritonserver given and the nvidia-pytriton wheel is not installed "
            "(pip install 'triton-gateway[engine]')"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def _install_stub(root: Path) -> None:
    """Put the Python-backend stub built for this interpreter where the backend looks for it."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    source = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    target = root / "backends" / "python" / "triton_python_backend_stub"
    if not source.exists():
        raise TritonNotFound(f"the pytriton wheel has no Python backend stub for Python {version}")
    if target.exists() and target.stat().st_size == source.stat().st_size:
        return
    staging = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.copy2(source, staging)
    staging.chmod(0o755)
    staging.replace(target)


def python_environment() -> dict[str, str]:
    """PATH and LD_LIBRARY_PATH so the Python-backend stub runs this interpreter's environment."""
    bin_dir = str(Path(sys.executable).parent)
    env = {"PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(libdir), os.environ.get("LD_LIBRARY_PATH", "")) if p
        )
    return env


def find_tritonserver(
    path: str | None = None, backend_directory: str | None = None
) -> TritonBinary:
    """An explicit binary (e.g. the NGC container's), else the one inside the pytriton wheel."""
    if path is not None:
        binary = Path(path)
        if not binary.is_file():
            raise TritonNotFound(f"tritonserver binary {binary} does not exist")
        backends = Path(backend_directory) if backend_directory else None
        return TritonBinary(binary, backends, python_environment())
    root = _pytriton_root()
    binary = root / "bin" / "tritonserver"
    if not binary.is_file():
        raise TritonNotFound(f"the pytriton wheel has no tritonserver at {binary}")
    _install_stub(root)
    backends = Path(backend_directory) if backend_directory else root / "backends"
    return TritonBinary(binary, backends, python_environment())


@dataclass(frozen=True)
class ServerArgs:
    """Everything that decides a tritonserver command line."""

    repository: Path
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    shm_prefix: str
    orchestrator_gpus: tuple[int, ...] | None = None
    log_verbose: int = 0
    extra_args: tuple[str, ...] = ()
    stub_timeout_s: int = 300
    """How long the Python backend waits for a model's stub to start and initialize (its own
    default is 30 s). When that runs out while the stub still initializes, the server waits for
    the stub to exit, which it never does, and the server never becomes ready: so this follows
    the sidecar's startup timeout (a model loading for minutes is no error)."""


def build_command(binary: TritonBinary, args: ServerArgs) -> list[str]:
    """The tritonserver command line; orchestrator mode mirrors ``launch_triton_server.py``."""
    cmd = [
        str(binary.path),
        f"--model-repository={args.repository}",
        f"--http-address={args.host}",
        f"--grpc-address={args.host}",
        f"--http-port={args.http_port}",
        f"--grpc-port={args.grpc_port}",
        f"--metrics-address={args.host}",
        f"--metrics-port={args.metrics_port}",
        "--exit-timeout-secs=10",
        f"--backend-config=python,shm-region-prefix-name={args.shm_prefix}",
        f"--backend-config=python,stub-timeout-seconds={args.stub_timeout_s}",
    ]
    if binary.backend_directory is not None:
        cmd.append(f"--backend-directory={binary.backend_directory}")
    if args.orchestrator_gpus is not None:
        cmd += ["--disable-auto-complete-config", "--enable-peer-access=false"]
        cmd += [f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in args.orchestrator_gpus]
    cmd.append("--pinned-memory-pool-byte-size=0")
    if args.log_verbose:
        cmd.append(f"--log-verbose={args.log_verbose}")
    cmd += list(args.extra_args)
    return cmd


def orchestrator_env() -> dict[str, str]:
    """Environment of TensorRT-LLM orchestrator mode with spawned executor workers."""
    return {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}


def parse_gpu_ids(value: str | None) -> tuple[int, ...]:
    """GPU ids of a ``gpu_device_ids`` value such as ``0,1;2,3``."""
    if not value:
        return ()
    ids = {int(part) for group in value.split(";") for part in group.split(",") if part.strip()}
    return tuple(sorted(ids))
