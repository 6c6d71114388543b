"""Gateway fixtures: settings over the test sidecar and a real uvicorn server on a free port."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import uvicorn
import yaml
from opentelemetry.sdk.trace.export import SpanExporter

from deploy.sidecar.parentdeath import dying_with_parent
from deploy.sidecar.supervisor import Sidecar
from gateway.app import create_app
from gateway.replicas.sources import Resolver, resolve_addresses
from gateway.server import uvicorn_config
from gateway.settings import LimitSettings, ModelSettings, Settings, Transport
from gateway.tenancy import TenancySettings

PORTS = range(23000, 23990)
ENSEMBLE_MODEL = "tiny"
BLS_MODEL = "tiny-bls"
ACCUMULATING_BLS_MODEL = "tiny2-bls"
SYNC_ENSEMBLE_MODEL = "tiny3"
SYNC_BLS_MODEL = "tiny3-bls"
ENGINE_MODEL = "tiny-engine"
"""The tiny pipeline's ``tensorrt_llm`` model itself: the gateway tokenizes and detokenizes."""


def _worker_ports() -> range:
    """This test process's share of ``PORTS``: under pytest-xdist each worker has its own, so
    two workers never pick the same free port at the same moment."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    share = len(PORTS) // max(count, 1)
    start = PORTS.start + int(worker or 0) * share
    return range(start, start + share)


def free_port() -> int:
    """A port of this process's share of the project's range that nobody listens on now.

    The search starts at a random port of the share: test runs of several checkouts on one
    host, each starting at the share's first port, would pick the same one and take it from
    each other between the choice and the bind."""
    ports = _worker_ports()
    start = random.randrange(len(ports))
    for offset in range(len(ports)):
        port = ports[(start + offset) % len(ports)]
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


TINY_MODELS = {
    ENSEMBLE_MODEL: ("tiny_ensemble", "ensemble"),
    BLS_MODEL: ("tiny_tensorrt_llm_bls", "tensorrt_llm_bls"),
    ACCUMULATING_BLS_MODEL: ("tiny2_tensorrt_llm_bls", "tensorrt_llm_bls"),
    SYNC_ENSEMBLE_MODEL: ("tiny3_ensemble", "ensemble"),
    SYNC_BLS_MODEL: ("tiny3_tensorrt_llm_bls", "tensorrt_llm_bls"),
    ENGINE_MODEL: ("tiny_tensorrt_llm", "tensorrt_llm"),
}
"""The test sidecar's pipelines as served models: name, then Triton model and entry."""
STOCK_RELEASE_PIPELINES = ("tiny2_", "tiny3_")
"""The test sidecar's pipelines of numbered releases, whose stock configs declare no
``cache_salt_id``: served to tenants as one shared KV-cache scope (``shared_kv_cache``)."""


def sidecar_settings(
    sidecar: Sidecar,
    tokenizer_dir: Path,
    transport: Transport = "grpc",
    models: dict[str, tuple[str, str]] = TINY_MODELS,
    **limits: float,
) -> Settings:
    """``models`` of ``sidecar`` (by default the tiny pipelines of the test sidecar) as served
    models, reached over ``transport`` (gRPC by default, as a supervised sidecar's are on a
    host at the usual socket buffer)."""

    def model(name: str, triton_model: str, entry: str) -> ModelSettings:
        return ModelSettings(
            name=name,
            triton_url=sidecar.grpc_url,
            transport=transport,
            triton_http_url=sidecar.http_url if transport == "http" else None,
            triton_model=triton_model,
            entry=entry,  # type: ignore[arg-type]
            tokenizer_dir=str(tokenizer_dir),
            shared_kv_cache=triton_model.startswith(STOCK_RELEASE_PIPELINES),
        )

    return Settings(
        models=tuple(model(name, *where) for name, where in models.items()),
        limits=msgspec.structs.replace(
            LimitSettings(request_timeout_s=60.0, shutdown_grace_s=5.0), **limits
        ),
        tenancy=TenancySettings(auth=False),
    )


def serve_process(
    config: dict[str, Any],
    workdir: Path,
    name: str,
    timeout_s: float = 90.0,
    env: dict[str, str] | None = None,
) -> tuple[str, subprocess.Popen[bytes]]:
    """`triton-gateway serve --config <name>.yaml` as its own process (``env`` added to this
    one's), once it is ready.

    Returns its base URL and the process; the log is ``<workdir>/<name>.log``.
    """
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = workdir / f"{name}.log"
    command = [str(Path(sys.executable).parent / "triton-gateway"), "serve", "--config",
               str(path), "--port", str(port)]  # fmt: skip
    # It gets SIGTERM (and drains, stopping its sidecars) should this process end first, a
    # benchmark stopped by a signal included.
    command, preexec = dying_with_parent(command)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec,
        )
    url = f"http://127.0.0.1:{port}"
    if not became_ready(url, process, timeout_s):
        process.kill()
        raise RuntimeError(f"gateway {name} did not start: {log_path.read_text()}")
    return url, process


def became_ready(
    url: str, process: subprocess.Popen[bytes], timeout_s: float, poll_s: float = 0.2
) -> bool:
    """Whether the gateway at ``url`` answered ``/health/ready`` with 200 before ``process``
    exited or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(poll_s)


def stop_process(
    process: subprocess.Popen[bytes], timeout_s: float = 60.0, *, group: bool = False
) -> None:
    """SIGTERM a served process (a gateway drains and stops its sidecars); SIGKILL if it hangs,
    with its whole process ``group`` (one started in a session of its own) where asked."""
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        if group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
        process.wait()


class LiveGateway:
    """A gateway served by uvicorn in a background thread."""

    def __init__(
        self,
        settings: Settings,
        span_exporter: SpanExporter | None = None,
        resolver: Resolver = resolve_addresses,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(settings, span_exporter=span_exporter, resolver=resolver)
        config = uvicorn_config(
            self.app,
            settings,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            log_config=uvicorn.config.LOGGING_CONFIG,
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="gateway", daemon=True)

    def start(self, timeout_s: float = 60.0) -> LiveGateway:
        """Serve, returning once uvicorn accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.05)
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> LiveGateway:
        """Return once ``/health/ready`` answers 200: every model has a replica up."""
        deadline = time.monotonic() + timeout_s
        while httpx.get(f"{self.url}/health/ready", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "the gateway never became ready"
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        """Shut down as on SIGTERM: drain, then run the lifespan's shutdown."""
        self._server.should_exit = True
        self._thread.join(timeout=30)


@pytest.fixture(scope="session")
def gateway_url(sidecar: Sidecar, tiny_model_dir: Path) -> Iterator[str]:
    """Base URL of a gateway serving ``tiny`` (ensemble), ``tiny-bls``, ``tiny2-bls``, and the
    non-decoupled ``tiny3`` (ensemble) and ``tiny3-bls``."""
    gateway = LiveGateway(sidecar_settings(sidecar, tiny_model_dir)).start()
    yield gateway.url
    gateway.stop()
