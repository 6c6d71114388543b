"""A spec's sidecars as a fleet: each rendered and built, started together, stopped together."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from deploy.sidecar.frontend import keeper
from deploy.sidecar.render import render_files, write_repository
from deploy.sidecar.spec import SidecarSpec, Spec, TensorRTLLMEngine
from deploy.sidecar.supervisor import Sidecar
from deploy.sidecar.tritonbin import find_tritonserver, parse_gpu_ids


def sidecar_from_spec(
    spec: Spec,
    sidecar: SidecarSpec,
    workdir: Path,
    *,
    response_keeper: Path | Literal["build"] | None = "build",
) -> Sidecar:
    """Render the repository of one sidecar of a spec and build (not start) its supervisor.

    ``response_keeper`` is the keeper its tritonserver preloads, built once by a caller that
    starts several (the gateway), or None for none; by default it is built here where the
    sidecar's ``keep_responses`` asks for it."""
    if isinstance(response_keeper, str):
        response_keeper = keeper.build() if sidecar.keep_responses else None
    repository = write_repository(
        render_files(spec, sidecar), Path(workdir) / sidecar.name / "repo"
    )
    binary = find_tritonserver(sidecar.tritonserver, sidecar.backend_directory)
    trtllm = [m for m in spec.models_of(sidecar) if isinstance(m.engine, TensorRTLLMEngine)]
    gpus = None
    if trtllm:
        gpus = tuple(
            sorted({g for m in trtllm for g in parse_gpu_ids(m.engine.gpu_device_ids)})  # type: ignore[union-attr]
        )
    return Sidecar(
        sidecar.name,
        repository,
        binary,
        host=sidecar.host,
        http_port=sidecar.http_port,
        grpc_port=sidecar.grpc_port,
        metrics_port=sidecar.metrics_port,
        env=dict(sidecar.env),
        orchestrator_gpus=gpus,
        startup_timeout_s=sidecar.startup_timeout_s,
        max_restarts=sidecar.max_restarts,
        log_path=Path(workdir) / f"{sidecar.name}.log",
        log_verbose=sidecar.log_verbose,
        extra_args=tuple(sidecar.extra_args),
        stop_grace_s=sidecar.stop_grace_s,
        keeper=response_keeper,
    )


def start_all(spec: Spec, workdir: Path) -> list[Sidecar]:
    """Start every sidecar of a spec; on failure stop the ones already running."""
    started: list[Sidecar] = []
    # Built once for all the sidecars that preload it.
    built = keeper.build() if any(s.keep_responses for s in spec.sidecars) else None
    try:
        for sidecar in spec.sidecars:
            preload = built if sidecar.keep_responses else None
            started.append(
                sidecar_from_spec(spec, sidecar, workdir, response_keeper=preload).start()
            )
    except BaseException:
        stop_all(started)
        raise
    return started


def stop_all(sidecars: list[Sidecar]) -> None:
    """Stop sidecars, last started first."""
    for sidecar in reversed(sidecars):
        sidecar.stop()
