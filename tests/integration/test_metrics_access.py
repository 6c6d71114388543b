"""Who reads the metrics and the readiness details: the admin key whenever one is set (as the
starter's settings do), or anyone where the operator opens them; never a tenant or a client with
no key by default."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.observability import MetricsSettings, ObservabilitySettings
from gateway.settings import Settings
from gateway.tenancy import KeyEntry, TenancySettings, TenantPolicy
from gateway.tenancy.service import digest, new_key
from tests.support.gateway import LiveGateway, free_port, serve_process, sidecar_settings

pytestmark = pytest.mark.slow

TENANT_KEY, ADMIN_KEY = new_key(), new_key()
HELLO = [{"role": "user", "content": "hello"}]


def _settings(sidecar: Sidecar, model_dir: Path, metrics: MetricsSettings) -> Settings:
    base = sidecar_settings(sidecar, model_dir)
    tenancy = TenancySettings(
        tenants=(TenantPolicy(name="watched"),),
        keys=(KeyEntry(tenant="watched", sha256=digest(TENANT_KEY)),),
        admin_key_sha256=digest(ADMIN_KEY),
    )
    return msgspec.structs.replace(
        base,
        models=base.models[:1],
        tenancy=tenancy,
        observability=ObservabilitySettings(metrics=metrics),
    )


def _generate(url: str) -> None:
    body = {"model": "tiny", "messages": HELLO, "max_tokens": 2}
    headers = {"Authorization": f"Bearer {TENANT_KEY}"}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers).status_code == 200


@pytest.fixture(scope="module")
def behind_admin_key(sidecar: Sidecar, tiny_model_dir: Path) -> Iterator[str]:
    """Metrics settings left as the starter leaves them, with an admin key set."""
    live = LiveGateway(_settings(sidecar, tiny_model_dir, MetricsSettings()))
    yield live.start().url
    live.stop()


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": f"Bearer {TENANT_KEY}"}, {"Authorization": "Bearer tgw-unknown"}],
    ids=["no-key", "tenant-key", "unknown-key"],
)
@pytest.mark.parametrize("path", ["/metrics", "/metrics/sidecars/tiny"])
def test_only_the_admin_key_scrapes_by_default(
    behind_admin_key: str, headers: dict[str, str], path: str
) -> None:
    refused = httpx.get(f"{behind_admin_key}{path}", headers=headers)
    assert refused.status_code == 401
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
    assert "watched" not in refused.text


def _scrape_after_generating(url: str, headers: dict[str, str]) -> str:
    """The metrics once the counters of a completion just answered are in."""
    line = (
        'gateway_generation_requests_total{adapter="",model="tiny",status="200",tenant="watched"}'
    )
    deadline = time.monotonic() + 10
    while True:
        scraped = httpx.get(f"{url}/metrics", headers=headers)
        assert scraped.status_code == 200
        assert scraped.headers["content-type"].startswith("text/plain")
        if line in scraped.text or time.monotonic() > deadline:
            return scraped.text
        time.sleep(0.05)


def test_the_admin_key_scrapes_the_tenants_metrics(behind_admin_key: str) -> None:
    _generate(behind_admin_key)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    scraped = _scrape_after_generating(behind_admin_key, admin)
    assert 'tenant="watched"' in scraped
    # Past the guard: this gateway supervises no sidecar (the test's Triton runs apart).
    sidecar = httpx.get(f"{behind_admin_key}/metrics/sidecars/tiny", headers=admin)
    assert sidecar.status_code == 404 and sidecar.json()["error"]["param"] == "name"


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": f"Bearer {TENANT_KEY}"}, {"Authorization": "Bearer tgw-unknown"}],
    ids=["no-key", "tenant-key", "unknown-key"],
)
def test_readiness_tells_anyone_its_status_and_only_the_admin_key_its_models(
    behind_admin_key: str, headers: dict[str, str]
) -> None:
    ready = httpx.get(f"{behind_admin_key}/health/ready", headers=headers)
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    assert httpx.get(f"{behind_admin_key}/health/live", headers=headers).status_code == 200
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    detailed = httpx.get(f"{behind_admin_key}/health/ready", headers=admin)
    assert detailed.json() == {"status": "ready", "models": {"tiny": True}}


@pytest.fixture(scope="module")
def on_their_own_port(sidecar: Sidecar, tiny_model_dir: Path) -> Iterator[tuple[str, str]]:
    port = free_port()
    with socket.socket() as held:  # so that the API does not pick the same free port
        held.bind(("127.0.0.1", port))
        # Opened explicitly: anyone who reaches the port of their own reads them.
        settings = _settings(sidecar, tiny_model_dir, MetricsSettings(port=port, auth="none"))
        server = msgspec.structs.replace(settings.server, keep_alive_s=1)
        live = LiveGateway(msgspec.structs.replace(settings, server=server))
    yield live.start().url, f"http://127.0.0.1:{port}"
    live.stop()


def test_metrics_on_their_own_port_and_not_on_the_api_port(
    on_their_own_port: tuple[str, str],
) -> None:
    api, metrics = on_their_own_port
    _generate(api)
    for path in ("/metrics", "/metrics/sidecars/tiny"):
        absent = httpx.get(f"{api}{path}", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert absent.status_code == 404
        assert set(absent.json()["error"]) == {"message", "type", "param", "code"}
    scraped = _scrape_after_generating(metrics, {})
    assert 'tenant="watched"' in scraped
    assert 'gateway_requests_total{method="POST",route="/v1/chat/completions",status="200"}' in (
        scraped
    )
    unknown = httpx.get(f"{metrics}/metrics/sidecars/nowhere")
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "name"
    for path in ("/v1/models", "/admin/tenants", "/health/ready"):
        assert httpx.get(f"{metrics}{path}").status_code == 404


def test_the_metrics_port_keeps_idle_connections_as_long_as_the_api_port(
    on_their_own_port: tuple[str, str],
) -> None:
    """``server.keep_alive_s`` (1 s here) holds on the metrics port too, not uvicorn's 5 s."""
    port = int(on_their_own_port[1].rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=3.0) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\n\r\n")
        received = b""
        while chunk := conn.recv(65536):  # the server closes it once idle: EOF, not a timeout
            received += chunk
    assert received.startswith(b"HTTP/1.1 200")


def test_a_metrics_port_already_taken_stops_the_start(
    sidecar: Sidecar,
    tiny_model_dir: Path,
    on_their_own_port: tuple[str, str],
    tmp_path: Path,
) -> None:
    taken = int(on_their_own_port[1].rsplit(":", 1)[1])
    config = {
        "models": [
            {
                "name": "tiny",
                "triton_url": sidecar.grpc_url,
                "triton_model": "tiny_ensemble",
                "tokenizer_dir": str(tiny_model_dir),
            }
        ],
        "tenancy": {"auth": False},
        "observability": {"metrics": {"port": taken}},
    }
    with pytest.raises(RuntimeError, match="did not start") as caught:
        serve_process(config, tmp_path, "taken", timeout_s=30)
    assert f"observability.metrics.port: cannot listen on 127.0.0.1:{taken}" in str(caught.value)
