"""Several tritonservers serving the tiny pipeline, one per loopback address and all on the same
ports (as the pods behind a headless Service), started together; and what to read from them."""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.ports import free_port
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from tests.support.sidecars import QUICK_STOP

PIPELINE = "tiny"
ENGINE_MODEL = f"{PIPELINE}_tensorrt_llm"
SUCCESS = re.compile(
    r'^nv_inference_request_success\{model="(?P<model>[^"]+)",version="1"\} (?P<n>\S+)$',
    re.MULTILINE,
)


def _free_everywhere(hosts: Sequence[str]) -> int:
    """A port free on every one of ``hosts`` (``free_port`` never gives one twice)."""
    for _ in range(200):
        port = free_port(hosts[0])
        try:
            for host in hosts[1:]:
                with socket.socket() as other:
                    other.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {hosts}")


def start_replicas(
    model_dir: Path,
    workdir: Path,
    hosts: Sequence[str],
    max_batch_sizes: Sequence[int],
    *,
    lora_cache_size: int = 2,
    engine_options: dict[str, object] | None = None,
    engines: dict[int, dict[str, object]] | None = None,
) -> list[Sidecar]:
    """One supervised tritonserver per host with the tiny model (latest release) at the engine
    batch size given for it; every one on the same gRPC, HTTP and metrics ports. ``engines``
    gives a host (by index) another engine spec instead, e.g. the paced load-test engine, at the
    host's batch size unless the spec sets its own.

    Only the engine model is loaded (the gateway's ``tensorrt_llm`` entry): one Python backend
    process per server instead of four starts faster and holds less memory.
    """
    ports = {kind: _free_everywhere(hosts) for kind in ("grpc_port", "http_port", "metrics_port")}
    sidecars = []
    for index, (host, batch) in enumerate(zip(hosts, max_batch_sizes, strict=True), 1):
        other = (engines or {}).get(index - 1)
        engine = (
            {"max_batch_size": batch, **other}
            if other
            else {
                "kind": "torch",
                "model_dir": str(model_dir),
                "max_batch_size": batch,
                "lora_cache_size": lora_cache_size,
                **(engine_options or {}),
            }
        )
        spec = parse_spec(
            {
                "models": [{"name": PIPELINE, "release": "latest", "engine": engine}],
                "sidecars": [
                    {
                        "name": f"r{index}",
                        "host": host,
                        "extra_args": [
                            "--model-control-mode=explicit",
                            f"--load-model={ENGINE_MODEL}",
                        ],
                        **ports,
                        **QUICK_STOP,
                    }
                ],
            }
        )
        sidecars.append(sidecar_from_spec(spec, spec.sidecars[0], workdir))
    with ThreadPoolExecutor(len(sidecars)) as pool:
        futures = [pool.submit(sidecar.start) for sidecar in sidecars]
        try:
            for future in futures:
                future.result()
        except BaseException:
            stop_replicas(sidecars)
            raise
    return sidecars


def stop_replicas(sidecars: Sequence[Sidecar]) -> None:
    """Stop them all at once."""
    with ThreadPoolExecutor(len(sidecars)) as pool:
        list(pool.map(lambda sidecar: sidecar.stop(), sidecars))


def served(sidecar: Sidecar, model: str = ENGINE_MODEL) -> int:
    """Requests ``model`` of ``sidecar`` answered successfully, by Triton's own count."""
    text = httpx.get(sidecar.metrics_url, timeout=5).text
    for match in SUCCESS.finditer(text):
        if match["model"] == model:
            return int(float(match["n"]))
    return 0
