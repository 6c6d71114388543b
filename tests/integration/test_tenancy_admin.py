"""The admin API over real Redis: PATCH keeps what it is not sent, PUT cannot widen by leaving
fields out, deleting a tenant revokes its keys, and run-time changes outlive a restart."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.tenancy import KeyEntry, StoreSettings, TenancySettings, TenantPolicy
from gateway.tenancy.service import digest, new_key
from tests.support.gateway import LiveGateway, serve_process, sidecar_settings, stop_process
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow

SEARCH = TenantPolicy(
    name="search",
    models=("tiny", "tiny-bls"),
    requests_per_minute=600,
    tokens_per_minute=200_000,
    tokens_per_day=50_000_000,
    max_concurrency=16,
    max_tokens=64,
    priority=1,
    burst=0.1,
)
KEYS = {"search": new_key(), "other": new_key()}
ADMIN_KEY = new_key()
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def url(sidecar: Sidecar, tiny_model_dir: Path, redis_server: RedisServer) -> Iterator[str]:
    tenancy = TenancySettings(
        tenants=(SEARCH, TenantPolicy(name="other")),
        keys=tuple(KeyEntry(tenant=name, sha256=digest(key)) for name, key in KEYS.items()),
        admin_key_sha256=digest(ADMIN_KEY),
        store=StoreSettings(kind="redis", url=redis_server.url, prefix="admin-live"),
    )
    settings = msgspec.structs.replace(sidecar_settings(sidecar, tiny_model_dir), tenancy=tenancy)
    live = LiveGateway(settings).start()
    yield live.url
    live.stop()


def _tenants(url: str) -> dict[str, dict[str, Any]]:
    listed = httpx.get(f"{url}/admin/tenants", headers=ADMIN).json()["data"]
    return {tenant["name"]: tenant for tenant in listed}


def _chat(url: str, key: str, model: str = "tiny") -> httpx.Response:
    body = {"model": model, "messages": HELLO, "max_tokens": 2}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def _opens(url: str, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.get(f"{url}/v1/models", headers=headers).status_code


def _json(policy: TenantPolicy) -> dict[str, Any]:
    """A policy as the API shows it."""
    shown: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(policy))
    return shown


def _full(policy: TenantPolicy, **changes: Any) -> dict[str, Any]:
    body = _json(msgspec.structs.replace(policy, **changes))
    del body["name"]
    return body


def test_patch_changes_only_the_fields_it_sends(url: str) -> None:
    before = _tenants(url)["search"]
    assert before == _json(SEARCH)
    lowered = httpx.patch(
        f"{url}/admin/tenants/search", json={"requests_per_minute": 100}, headers=ADMIN
    )
    assert lowered.status_code == 200, lowered.text
    assert lowered.json() == {**before, "requests_per_minute": 100}
    assert _tenants(url)["search"] == lowered.json()
    answer = _chat(url, KEYS["search"])
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-ratelimit-limit-requests"] == "100"
    assert _chat(url, KEYS["search"], "tiny2-bls").status_code == 404  # models did not widen

    lifted = httpx.patch(f"{url}/admin/tenants/search", json={"max_tokens": None}, headers=ADMIN)
    assert lifted.json() == {**before, "requests_per_minute": 100, "max_tokens": None}
    for body, param in (({"priority": None}, "priority"), ({"name": "x"}, "name"),
                        ({"burst": 0}, "burst"), ({"models": "tiny"}, "models")):  # fmt: skip
        refused = httpx.patch(f"{url}/admin/tenants/search", json=body, headers=ADMIN)
        assert refused.status_code == 400, body
        assert refused.json()["error"]["param"] == param
    assert _tenants(url)["search"] == lifted.json()
    missing = httpx.patch(f"{url}/admin/tenants/nobody", json={"priority": 2}, headers=ADMIN)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "name"
    tenant_key = {"Authorization": f"Bearer {KEYS['search']}"}
    assert (
        httpx.patch(f"{url}/admin/tenants/search", json={}, headers=tenant_key).status_code == 401
    )


def test_put_refuses_a_policy_with_fields_left_out(url: str) -> None:
    before = _tenants(url)["other"]
    partial = httpx.put(
        f"{url}/admin/tenants/other", json={"requests_per_minute": 100}, headers=ADMIN
    )
    assert partial.status_code == 400
    error = partial.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "models")
    for field in ("models", "adapters", "tokens_per_minute", "tokens_per_day",
                  "max_concurrency", "max_tokens", "priority", "burst"):  # fmt: skip
        assert field in error["message"]
    assert "requests_per_minute" not in error["message"]
    assert _tenants(url)["other"] == before
    whole = _full(TenantPolicy(name="other"), models=("tiny-bls",), requests_per_minute=100)
    replaced = httpx.put(f"{url}/admin/tenants/other", json=whole, headers=ADMIN)
    assert replaced.status_code == 200
    assert _tenants(url)["other"] == {**whole, "name": "other"}
    assert _chat(url, KEYS["other"], "tiny").status_code == 404
    assert _chat(url, KEYS["other"], "tiny-bls").headers["x-ratelimit-limit-requests"] == "100"


def test_deleting_a_tenant_revokes_its_keys_for_good(url: str) -> None:
    policy = _full(TenantPolicy(name="temp"))
    assert httpx.put(f"{url}/admin/tenants/temp", json=policy, headers=ADMIN).status_code == 200
    made = httpx.post(f"{url}/admin/keys", json={"tenant": "temp"}, headers=ADMIN).json()
    assert _opens(url, made["key"]) == 200
    assert httpx.delete(f"{url}/admin/tenants/temp", headers=ADMIN).status_code == 204
    assert _opens(url, made["key"]) == 401
    listed = httpx.get(f"{url}/admin/keys", headers=ADMIN).json()["data"]
    assert made["key_id"] not in {key["key_id"] for key in listed}
    assert httpx.put(f"{url}/admin/tenants/temp", json=policy, headers=ADMIN).status_code == 200
    assert _opens(url, made["key"]) == 401  # created again: its old keys stay revoked
    refused = httpx.post(f"{url}/admin/keys", json={"tenant": "gone"}, headers=ADMIN)
    assert refused.status_code == 404 and refused.json()["error"]["param"] == "tenant"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("team-b%0A", {}, "name"),
        ("team-b%0D", {}, "name"),
        ("other", {"priority": -5}, "priority"),
        ("other", {"priority": 10**6}, "priority"),
    ],
)
def test_tenant_inputs_are_matched_whole_and_bounded(
    url: str, path: str, body: dict[str, Any], param: str
) -> None:
    whole = {**_full(TenantPolicy(name="x")), **body}
    refused = httpx.put(f"{url}/admin/tenants/{path}", json=whole, headers=ADMIN)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert param in error["message"]
    listed = _tenants(url)
    assert not [name for name in listed if name.startswith("team-b")]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tenant": "other", "name": "n" * 129}, "name"),
        ({"tenant": "other", "name": "ci\nkey tenant=search"}, "name"),
        ({"tenant": "other\n"}, "tenant"),
    ],
)
def test_key_inputs_are_matched_whole_and_bounded(
    url: str, body: dict[str, Any], param: str
) -> None:
    before = httpx.get(f"{url}/admin/keys", headers=ADMIN).json()["data"]
    refused = httpx.post(f"{url}/admin/keys", json=body, headers=ADMIN)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == param
    assert httpx.get(f"{url}/admin/keys", headers=ADMIN).json()["data"] == before


FILE_KEYS = {name: new_key() for name in ("keep-1", "keep-2", "patched-1", "doomed-1")}


def _served(sidecar: Sidecar, model_dir: Path, redis_url: str, rpm: int) -> dict[str, Any]:
    tenants = [
        {"name": "keep"},
        {"name": "patched", "requests_per_minute": rpm},
        {"name": "doomed"},
    ]
    return {
        "models": [
            {
                "name": "tiny",
                "triton_url": sidecar.grpc_url,
                "triton_model": "tiny_ensemble",
                "tokenizer_dir": str(model_dir),
            }
        ],
        "limits": {"drain_delay_s": 0, "shutdown_grace_s": 2},
        "tenancy": {
            "tenants": tenants,
            "keys": [
                {"tenant": name.rsplit("-", 1)[0], "sha256": digest(key), "name": name}
                for name, key in FILE_KEYS.items()
            ],
            "admin_key_sha256": digest(ADMIN_KEY),
            "store": {"kind": "redis", "url": redis_url, "prefix": "admin-restart"},
        },
    }


def test_run_time_changes_win_over_the_file_across_a_restart(
    sidecar: Sidecar, tiny_model_dir: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    config = _served(sidecar, tiny_model_dir, redis_server.url, rpm=600)
    url, process = serve_process(config, tmp_path, "first")
    try:
        key_id = {name: digest(key)[:12] for name, key in FILE_KEYS.items()}
        patched = httpx.patch(
            f"{url}/admin/tenants/patched", json={"requests_per_minute": 100}, headers=ADMIN
        )
        assert patched.status_code == 200
        assert httpx.delete(f"{url}/admin/tenants/doomed", headers=ADMIN).status_code == 204
        assert _opens(url, FILE_KEYS["doomed-1"]) == 401  # at once
        revoked = httpx.delete(f"{url}/admin/keys/{key_id['keep-2']}", headers=ADMIN)
        assert revoked.status_code == 204
        made = httpx.post(f"{url}/admin/keys", json={"tenant": "keep"}, headers=ADMIN).json()
    finally:
        stop_process(process)
    first_log = (tmp_path / "first.log").read_text()
    assert "auth: on, 3 tenant(s) and 4 key(s) in force, limits in redis" in first_log

    # The file now says 300 requests a minute for `patched`, and still defines `doomed`.
    second = copy.deepcopy(config)
    second["tenancy"]["tenants"][1]["requests_per_minute"] = 300
    url, process = serve_process(second, tmp_path, "second")
    try:
        assert set(_tenants(url)) == {"keep", "patched"}
        assert _tenants(url)["patched"]["requests_per_minute"] == 100
        listed = {k["key_id"] for k in httpx.get(f"{url}/admin/keys", headers=ADMIN).json()["data"]}
        assert listed == {key_id["keep-1"], key_id["patched-1"], made["key_id"]}
        for name, status in (("keep-1", 200), ("keep-2", 401), ("patched-1", 200),
                             ("doomed-1", 401)):  # fmt: skip
            assert _opens(url, FILE_KEYS[name]) == status, name
        assert _opens(url, made["key"]) == 200
        limited = _chat(url, FILE_KEYS["patched-1"])
        assert limited.headers["x-ratelimit-limit-requests"] == "100"
        recreated = httpx.put(
            f"{url}/admin/tenants/doomed", json=_full(TenantPolicy(name="doomed")), headers=ADMIN
        )
        assert recreated.status_code == 200
        assert _opens(url, FILE_KEYS["doomed-1"]) == 401
    finally:
        stop_process(process)
    log = (tmp_path / "second.log").read_text()
    assert "auth: on, 2 tenant(s) and 3 key(s) in force, limits in redis" in log
    for line in (
        "tenancy: 2 tenant(s) and 3 key(s) in force (the settings file has 3 and 4",
        "tenant doomed: deleted at run time; the settings file's definition is not in force",
        "tenant patched: the run-time policy is in force; it differs from the settings file's "
        "in requests_per_minute",
        f"key {key_id['keep-2']} of tenant keep: revoked at run time",
        f"key {key_id['doomed-1']} of tenant doomed: revoked at run time",
        "1 key(s) made at run time are in force",
    ):
        assert line in log, line
