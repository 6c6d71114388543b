"""A stream the client drops is accounted as what it used: the tokens that reached the client
(and the rest the engine reported) show in the access line, the per-tenant token counters and
the limiter's charge alike; a request refused before Triton counts none."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.tenancy.config import KeyEntry, TenancySettings, TenantPolicy
from gateway.tenancy.service import digest, new_key
from tests.support.gateway import (
    BLS_MODEL,
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    LiveGateway,
    sidecar_settings,
)
from tests.support.prometheus import total

pytestmark = pytest.mark.slow
KEY = new_key()
ADMIN = new_key()
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}
"""The metrics are behind the admin key: tenants' names are in them."""
READ = 50
"""Streamed tokens the client reads before it hangs up."""


@pytest.fixture(scope="module")
def gateway(sidecar: Sidecar, tiny_model_dir: Path) -> Iterator[str]:
    tenancy = TenancySettings(
        tenants=(TenantPolicy(name="reader", max_tokens=4000),),
        keys=(KeyEntry(tenant="reader", sha256=digest(KEY)),),
        admin_key_sha256=digest(ADMIN),
    )
    settings = msgspec.structs.replace(sidecar_settings(sidecar, tiny_model_dir), tenancy=tenancy)
    live = LiveGateway(settings).start()
    yield live.url
    live.stop()


def _counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", headers=ADMIN_HEADERS).text
    families = ("prompt_tokens", "completion_tokens", "tenant_tokens")
    return {name: total(text, f"gateway_{name}_total", tenant="reader") for name in families}


def _settled(url: str) -> None:
    deadline = time.monotonic() + 20
    text = httpx.get(f"{url}/metrics", headers=ADMIN_HEADERS).text
    while total(text, "gateway_tenant_requests_in_flight", tenant="reader") > 0:
        assert time.monotonic() < deadline, "the dropped stream never ended"
        time.sleep(0.05)
        text = httpx.get(f"{url}/metrics", headers=ADMIN_HEADERS).text


def _access_line(caplog: pytest.LogCaptureFixture, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for record in caplog.records:
            if record.name == "gateway.access" and record.__dict__.get("request_id") == request_id:
                return record.__dict__
        time.sleep(0.05)
    raise AssertionError(f"no access line for {request_id}")


@pytest.mark.parametrize("model", [ENSEMBLE_MODEL, BLS_MODEL, ENGINE_MODEL])
def test_a_dropped_stream_counts_every_token_sent(
    gateway: str, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    before = _counters(gateway)
    request_id = f"dropped-{model}"
    body = {"model": model, "prompt": "The cat", "max_tokens": 4000, "min_tokens": 4000}
    headers = {"Authorization": f"Bearer {KEY}", "X-Request-ID": request_id}
    sent = 0
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        with httpx.Client(base_url=gateway, timeout=60) as client:
            stream_body = {**body, "stream": True}
            with client.stream(
                "POST", "/v1/completions", json=stream_body, headers=headers
            ) as reply:
                assert reply.status_code == 200
                for line in reply.iter_lines():
                    if line.startswith("data: {"):
                        chunk = httpx.Response(200, content=line[6:]).json()
                        sent += sum(bool(c["text"]) for c in chunk["choices"])
                    if sent >= READ:
                        break  # the client hangs up mid-stream
        _settled(gateway)
        access = _access_line(caplog, request_id)
    after = _counters(gateway)
    grew = {name: after[name] - before[name] for name in after}
    assert access["status"] == 200
    assert access["completion_tokens"] >= sent >= READ
    assert access["prompt_tokens"] > 0
    assert grew["completion_tokens"] == access["completion_tokens"]
    assert grew["prompt_tokens"] == access["prompt_tokens"]
    # The limiter charged what the counters count.
    assert grew["tenant_tokens"] == access["prompt_tokens"] + access["completion_tokens"]


def test_a_request_refused_before_triton_counts_nothing(gateway: str) -> None:
    before = _counters(gateway)
    body = {"model": ENSEMBLE_MODEL, "prompt": "The cat", "max_tokens": 5000, "stream": True}
    refused = httpx.post(
        f"{gateway}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert refused.status_code == 400
    assert _counters(gateway) == before
