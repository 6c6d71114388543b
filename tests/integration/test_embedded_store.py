"""The embedded store: a real redis-server the gateway runs, keeping its data in a file; the
store a settings file gets when it names none."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import redis

from deploy.sidecar.supervisor import Sidecar
from gateway.settings import load_settings
from gateway.tenancy.service import digest, new_key
from gateway.workers.pool import embedded_data_file, needs_embedded_redis, worker_settings
from gateway.workers.redis import EmbeddedRedis
from tests.support.gateway import serve_process, stop_process

TEAM_KEY = new_key()
ADMIN_KEY = new_key()
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def test_its_data_survives_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "state" / "tenancy.rdb"
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    first = EmbeddedRedis(tmp_path / "a", data).start()
    try:
        redis.Redis(unix_socket_path=str(first.socket)).set("tgw:tenant", "changed")
    finally:
        first.stop()
    assert data.is_file()
    second = EmbeddedRedis(tmp_path / "b", data).start()
    try:
        assert redis.Redis(unix_socket_path=str(second.socket)).get("tgw:tenant") == b"changed"
    finally:
        second.stop()


def test_a_snapshot_that_cannot_be_written_does_not_stop_the_counting(tmp_path: Path) -> None:
    """Redis refuses every write after a failed snapshot unless told otherwise (MISCONF), and
    the limits' scripts would then fail open."""
    data = tmp_path / "state" / "tenancy.rdb"
    (tmp_path / "run").mkdir()
    server = EmbeddedRedis(tmp_path / "run", data).start()
    try:
        client = redis.Redis(unix_socket_path=str(server.socket))
        shutil.rmtree(data.parent)  # where its snapshots go is gone
        client.set("tgw:count", 1)
        deadline = time.monotonic() + 30
        while client.info("persistence")["rdb_last_bgsave_status"] == "ok":
            assert time.monotonic() < deadline, "no snapshot was tried"
            time.sleep(0.1)
        assert client.incr("tgw:count") == 2
    finally:
        server.stop()


def test_the_settings_name_it_and_its_file_beside_them(tmp_path: Path) -> None:
    (tmp_path / "gateway.yaml").write_text(
        "tenancy: {auth: false, store: {kind: embedded, path: tenancy.rdb}}\n"
    )
    settings = load_settings(tmp_path / "gateway.yaml")
    assert needs_embedded_redis(settings)
    assert embedded_data_file(settings) == tmp_path / "tenancy.rdb"
    shared = worker_settings(settings, EmbeddedRedis(tmp_path))
    assert shared.tenancy.store.kind == "redis"
    assert shared.tenancy.store.url == f"unix://{tmp_path / 'redis.sock'}"


def test_memory_is_kept_only_with_one_worker(tmp_path: Path) -> None:
    (tmp_path / "gateway.yaml").write_text("tenancy: {auth: false}\n")
    settings = load_settings(tmp_path / "gateway.yaml")
    assert not needs_embedded_redis(settings)
    two = msgspec.structs.replace(
        settings, server=msgspec.structs.replace(settings.server, workers=2)
    )
    assert needs_embedded_redis(two)
    assert embedded_data_file(two) is None


def _served(sidecar: Sidecar, model_dir: Path, **store: str) -> dict[str, Any]:
    """A settings file a user writes: a model, a tenant and its key, an admin key, and the
    store only where ``store`` names one."""
    tenancy: dict[str, Any] = {
        "tenants": [{"name": "team", "requests_per_minute": 600}],
        "keys": [{"tenant": "team", "sha256": digest(TEAM_KEY)}],
        "admin_key_sha256": digest(ADMIN_KEY),
    }
    if store:
        tenancy["store"] = store
    model = {"name": "tiny", "triton_url": sidecar.grpc_url, "triton_model": "tiny_ensemble",
             "tokenizer_dir": str(model_dir)}  # fmt: skip
    return {"models": [model], "limits": {"drain_delay_s": 0, "shutdown_grace_s": 2},
            "tenancy": tenancy}  # fmt: skip


def _tenant(url: str) -> dict[str, Any]:
    listed: list[dict[str, Any]] = httpx.get(f"{url}/admin/tenants", headers=ADMIN).json()["data"]
    return {tenant["name"]: tenant for tenant in listed}["team"]


def _opens(url: str, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.get(f"{url}/v1/models", headers=headers).status_code


@pytest.mark.slow
def test_a_file_naming_no_store_keeps_admin_changes_beside_it_across_a_restart(
    sidecar: Sidecar, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = _served(sidecar, tiny_model_dir)
    url, process = serve_process(config, tmp_path, "gateway")
    try:
        patched = httpx.patch(
            f"{url}/admin/tenants/team", json={"requests_per_minute": 100}, headers=ADMIN
        )
        assert patched.status_code == 200, patched.text
        made = httpx.post(f"{url}/admin/keys", json={"tenant": "team"}, headers=ADMIN)
        assert made.status_code == 201, made.text
        key = made.json()["key"]
        assert _opens(url, key) == 200
    finally:
        stop_process(process)
    log = (tmp_path / "gateway.log").read_text()
    assert f"embedded redis-server, kept in {tmp_path / 'tenancy.rdb'}" in log
    assert (tmp_path / "tenancy.rdb").is_file()

    url, process = serve_process(config, tmp_path, "gateway")
    try:
        assert _tenant(url)["requests_per_minute"] == 100
        assert _opens(url, key) == 200
        assert _opens(url, TEAM_KEY) == 200
    finally:
        stop_process(process)


@pytest.mark.slow
def test_memory_named_answers_admin_writes_with_what_to_change(
    sidecar: Sidecar, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = _served(sidecar, tiny_model_dir, kind="memory")
    url, process = serve_process(config, tmp_path, "gateway")
    try:
        patched = httpx.patch(
            f"{url}/admin/tenants/team", json={"requests_per_minute": 100}, headers=ADMIN
        )
        made = httpx.post(f"{url}/admin/keys", json={"tenant": "team"}, headers=ADMIN)
    finally:
        stop_process(process)
    for answer in (patched, made):
        assert answer.status_code == 409
        message = answer.json()["error"]["message"]
        assert "remove tenancy.store.kind: memory from the settings file" in message
        assert "set tenancy.store.kind: embedded" in message
    assert "limits in memory" in (tmp_path / "gateway.log").read_text()
    assert not (tmp_path / "tenancy.rdb").exists()
