"""API keys, tenants and limits through the gateway, with the memory store and with real Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.tenancy import KeyEntry, StoreSettings, TenancySettings, TenantPolicy
from gateway.tenancy.service import digest, new_key
from tests.support.gateway import LiveGateway, sidecar_settings
from tests.support.prometheus import total
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow
CAP = 8
TPM = 3840
"""A refill interval of 60/3840 s = 2**-6 s is exact in binary, so the remaining tokens in the
headers come out exact whatever the clock reads."""

TENANTS = {
    "alpha": TenantPolicy(name="alpha", models=("tiny", "tiny-bls"), max_tokens=64),
    "beta": TenantPolicy(name="beta", models=("tiny2-*",), requests_per_minute=600),
    "slow": TenantPolicy(name="slow", requests_per_minute=60, burst=1 / 60),  # one a second
    "small": TenantPolicy(name="small", tokens_per_minute=120, burst=1.0),
    "pair": TenantPolicy(name="pair", max_concurrency=2, tokens_per_minute=60_000),
    **{
        name: TenantPolicy(name=name, requests_per_minute=1, burst=1.0)
        for name in ("once-whole", "once-stream")
    },
    **{
        name: TenantPolicy(name=name, max_tokens=CAP, tokens_per_minute=TPM)
        for name in ("capped", "capped-chat", "ref-chat", "capped-text", "ref-text")
    },
}
KEYS = {name: new_key() for name in TENANTS}
ADMIN_KEY = new_key()
SCRAPER = {"Authorization": f"Bearer {ADMIN_KEY}"}
HELLO = [{"role": "user", "content": "hello"}]


@dataclass
class Gateway:
    url: str
    store: str

    def client(self, tenant: str, **options: Any) -> openai.OpenAI:
        options.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEYS[tenant], **options)

    def post(self, path: str, body: dict[str, Any], key: str | None = None, **kw: Any) -> Any:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(f"{self.url}{path}", json=body, headers=headers, timeout=60, **kw)

    def metric(self, family: str, **labels: str) -> float:
        return total(httpx.get(f"{self.url}/metrics", headers=SCRAPER).text, family, **labels)


@pytest.fixture(scope="module", params=["memory", "redis"])
def gateway(
    request: pytest.FixtureRequest,
    sidecar: Sidecar,
    tiny_model_dir: Path,
    redis_server: RedisServer,
) -> Iterator[Gateway]:
    store = StoreSettings(kind=request.param, url=redis_server.url, prefix=f"gw-{request.param}")
    tenancy = TenancySettings(
        tenants=tuple(TENANTS.values()),
        keys=tuple(KeyEntry(tenant=name, sha256=digest(key)) for name, key in KEYS.items()),
        admin_key_sha256=digest(ADMIN_KEY),
        store=store,
    )
    settings = msgspec.structs.replace(sidecar_settings(sidecar, tiny_model_dir), tenancy=tenancy)
    live = LiveGateway(settings).start()
    yield Gateway(live.url, request.param)
    live.stop()


def _error(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["error"]
    return body


@pytest.mark.parametrize(
    ("headers", "message", "models"),
    [
        ({}, "You didn't provide an API key", 401),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "Malformed API key", 401),
        ({"Authorization": "Bearer tgw-not-a-key"}, "Incorrect API key", 401),
        ({"Authorization": f"Bearer {ADMIN_KEY}"}, "This is the admin key", 200),
    ],
    ids=["missing", "malformed", "unknown", "admin-key"],
)
def test_requests_without_a_tenant_key_are_401(
    gateway: Gateway, headers: dict[str, str], message: str, models: int
) -> None:
    """The admin key generates nothing; it may list the models (with their folders)."""
    body = {"model": "tiny", "messages": HELLO, "max_tokens": 2}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 401
    error = _error(response)
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
    assert error["message"].startswith(message)
    assert httpx.get(f"{gateway.url}/v1/models", headers=headers).status_code == models


def test_azure_style_api_key_header(gateway: Gateway) -> None:
    response = httpx.get(f"{gateway.url}/v1/models", headers={"api-key": KEYS["alpha"]})
    assert response.status_code == 200


def test_a_tenant_sees_only_its_models(gateway: Gateway) -> None:
    assert [m.id for m in gateway.client("alpha").models.list()] == ["tiny", "tiny-bls"]
    assert [m.id for m in gateway.client("beta").models.list()] == ["tiny2-bls"]
    forbidden = gateway.post(
        "/v1/chat/completions", {"model": "tiny2-bls", "messages": HELLO}, KEYS["alpha"]
    )
    missing = gateway.post(
        "/v1/chat/completions", {"model": "no-such", "messages": HELLO}, KEYS["alpha"]
    )
    assert forbidden.status_code == missing.status_code == 404
    assert _error(forbidden)["code"] == "model_not_found"
    assert _error(forbidden)["message"] == _error(missing)["message"].replace(
        "no-such", "tiny2-bls"
    )
    with pytest.raises(openai.NotFoundError):
        gateway.client("beta").models.retrieve("tiny")


def test_rate_limit_headers_on_answers_and_errors(gateway: Gateway) -> None:
    ok = gateway.post(
        "/v1/chat/completions", {"model": "tiny2-bls", "messages": HELLO, "max_tokens": 2},
        KEYS["beta"],
    )  # fmt: skip
    assert ok.status_code == 200
    assert ok.headers["x-ratelimit-limit-requests"] == "600"
    assert 0 < int(ok.headers["x-ratelimit-remaining-requests"]) < 600
    assert ok.headers["x-ratelimit-reset-requests"].endswith("ms")
    bad = gateway.post(
        "/v1/chat/completions",
        {"model": "tiny2-bls", "messages": HELLO, "temperature": 9},
        KEYS["beta"],
    )
    assert bad.status_code == 400
    assert bad.headers["x-ratelimit-limit-requests"] == "600"


def test_429_says_which_limit_and_when_and_the_sdk_retry_succeeds(gateway: Gateway) -> None:
    body = {"model": "tiny", "prompt": "The cat", "max_tokens": 2}
    assert gateway.post("/v1/completions", body, KEYS["slow"]).status_code == 200
    refused = gateway.post("/v1/completions", body, KEYS["slow"])
    assert refused.status_code == 429
    error = _error(refused)
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert "requests per minute (limit 60)" in error["message"]
    assert refused.headers["Retry-After"] == "1"
    assert 0 < int(refused.headers["retry-after-ms"]) <= 1000
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    started = time.monotonic()
    with gateway.client("slow", max_retries=1) as client:
        client.completions.create(model="tiny", prompt="The cat", max_tokens=2)
    assert time.monotonic() - started < 10
    # Another tenant's budget is untouched by all this.
    assert gateway.post("/v1/completions", body, KEYS["alpha"]).status_code == 200


def _triton_requests(sidecar: Sidecar) -> float:
    text = httpx.get(sidecar.metrics_url).text
    return total(text, "nv_inference_request_success") + total(text, "nv_inference_request_failure")


def _settled_triton_requests(sidecar: Sidecar) -> float:
    """Triton's count once it has stopped moving: Triton counts a request (and its ensemble's
    steps) when it releases it, which may come just after its last event reached the client."""
    count = _triton_requests(sidecar)
    for _ in range(25):
        time.sleep(0.2)
        count, before = _triton_requests(sidecar), count
        if count == before:
            break
    return count


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_refused_request_never_reaches_triton(
    gateway: Gateway, sidecar: Sidecar, stream: bool
) -> None:
    """With Redis the admission is answered while the Triton request is built: it still gates
    the sending, with the 429 and its headers as before."""
    body = {"model": "tiny", "prompt": "The cat", "max_tokens": 2, "stream": stream}
    key = KEYS["once-stream" if stream else "once-whole"]  # one request a minute
    admitted = gateway.post("/v1/completions", body, key)
    assert admitted.status_code == 200 and admitted.headers["x-ratelimit-limit-requests"] == "1"
    sent = _settled_triton_requests(sidecar)
    assert sent > 0
    refused = gateway.post("/v1/completions", body, key)
    assert refused.status_code == 429
    assert _error(refused)["code"] == "rate_limit_exceeded"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    time.sleep(0.5)  # Triton counts a request when it ends: one sent and cut would show by now
    assert _triton_requests(sidecar) == sent


def test_requests_that_can_never_fit_are_400(gateway: Gateway) -> None:
    too_long = gateway.post(
        "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 65}, KEYS["alpha"]
    )
    assert too_long.status_code == 400
    assert _error(too_long)["param"] == "max_tokens"
    assert "64" in _error(too_long)["message"]
    never = gateway.post(
        "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 200}, KEYS["small"]
    )
    assert never.status_code == 400
    assert "can ever hold (120)" in _error(never)["message"]


def _reserved(gateway: Gateway, path: str, body: dict[str, Any], tenant: str) -> int:
    """What the tenant's first request reserved: a full bucket less what the answer says is
    left right after its admission."""
    answer = gateway.post(path, body, KEYS[tenant])
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-ratelimit-limit-tokens"] == str(TPM)
    choices = answer.json()["choices"]
    assert len(choices) == body.get("n", 1)
    assert 0 < answer.json()["usage"]["completion_tokens"] <= len(choices) * CAP
    return TPM - int(answer.headers["x-ratelimit-remaining-tokens"])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "tiny", "messages": HELLO, "n": 2}),
        ("/v1/completions", {"model": "tiny", "prompt": "The cat", "n": 2}),
    ],
    ids=["chat", "text"],
)
def test_a_capped_tenant_without_max_tokens_gets_and_reserves_its_cap(
    gateway: Gateway, path: str, body: dict[str, Any]
) -> None:
    """The default is the smaller of the window and the cap, and the reservation is the prompt
    plus the cap for each choice: the same request with ``max_tokens: 1`` (one choice), on a
    fresh tenant, measures the prompt."""
    kind = "chat" if "messages" in body else "text"
    prompt = _reserved(gateway, path, {**body, "n": 1, "max_tokens": 1}, f"ref-{kind}") - 1
    assert _reserved(gateway, path, body, f"capped-{kind}") == prompt + 2 * CAP


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_only_an_explicit_max_tokens_above_the_cap_is_a_400(gateway: Gateway, field: str) -> None:
    body = {"model": "tiny", "messages": HELLO}
    at_cap = gateway.post("/v1/chat/completions", {**body, field: CAP}, KEYS["capped"])
    assert at_cap.status_code == 200
    above = gateway.post("/v1/chat/completions", {**body, field: CAP + 1}, KEYS["capped"])
    assert above.status_code == 400
    assert _error(above)["param"] == "max_tokens"
    assert _error(above)["message"] == (
        f"max_tokens is {CAP + 1}, more than the {CAP} your key allows per choice."
    )


@pytest.mark.parametrize("stream", [False, True])
def test_tokens_charged_are_the_usage(gateway: Gateway, stream: bool) -> None:
    before = gateway.metric("gateway_tenant_tokens_total", tenant="pair")
    with gateway.client("pair") as client:
        if stream:
            chunks = list(
                client.chat.completions.create(
                    model="tiny", messages=HELLO, max_tokens=12, n=2, stream=True,
                    stream_options={"include_usage": True},
                )
            )  # fmt: skip
            usage = chunks[-1].usage
        else:
            usage = client.chat.completions.create(
                model="tiny", messages=HELLO, max_tokens=12, n=2
            ).usage
    assert usage is not None and usage.completion_tokens == 24
    time.sleep(0.2)
    assert (
        gateway.metric("gateway_tenant_tokens_total", tenant="pair") - before == usage.total_tokens
    )


def test_leases_return_to_zero_after_clients_hang_up_mid_stream(gateway: Gateway) -> None:
    body = {"model": "tiny", "prompt": "The cat", "max_tokens": 3000, "stream": True}
    headers = {"Authorization": f"Bearer {KEYS['pair']}"}
    charged = gateway.metric("gateway_tenant_tokens_total", tenant="pair")
    for _ in range(2):  # twice: a leaked lease would lock the tenant out the second time
        clients = [httpx.Client(base_url=gateway.url, timeout=60) for _ in range(2)]
        for client in clients:
            with client.stream("POST", "/v1/completions", json=body, headers=headers) as reply:
                assert reply.status_code == 200
                next(line for line in reply.iter_lines() if line.startswith("data: "))
            client.close()  # hang up mid-stream
        deadline = time.monotonic() + 20
        while gateway.metric("gateway_tenant_requests_in_flight", tenant="pair") > 0:
            assert time.monotonic() < deadline, "a lease was not released"
            time.sleep(0.05)
    spent = gateway.metric("gateway_tenant_tokens_total", tenant="pair") - charged
    assert 0 < spent < 4 * 3000, (
        "hung-up requests are charged what they used, not their reservation"
    )


def test_admin_api(gateway: Gateway) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    listed = httpx.get(f"{gateway.url}/admin/tenants", headers=admin)
    assert listed.status_code == 200
    assert {t["name"] for t in listed.json()["data"]} == set(TENANTS)
    tenant_key = {"Authorization": f"Bearer {KEYS['alpha']}"}
    assert httpx.get(f"{gateway.url}/admin/keys", headers=tenant_key).status_code == 401
    made = httpx.post(f"{gateway.url}/admin/keys", json={"tenant": "beta"}, headers=admin)
    if gateway.store == "memory":
        patched = httpx.patch(
            f"{gateway.url}/admin/tenants/beta", json={"priority": 2}, headers=admin
        )
        for refused in (made, patched):
            assert refused.status_code == 409
            assert _error(refused)["code"] == "store_read_only"
            assert "tenancy.store.kind: embedded" in _error(refused)["message"]
        return
    assert made.status_code == 201
    key = made.json()["key"]
    assert made.json()["sha256"] == digest(key)
    ids = [
        k["key_id"] for k in httpx.get(f"{gateway.url}/admin/keys", headers=admin).json()["data"]
    ]
    assert made.json()["key_id"] in ids and all("key" not in k for k in ids)
    body = {"model": "tiny2-bls", "messages": HELLO, "max_tokens": 2}
    assert gateway.post("/v1/chat/completions", body, key).status_code == 200
    revoked = httpx.delete(f"{gateway.url}/admin/keys/{made.json()['key_id']}", headers=admin)
    assert revoked.status_code == 204
    assert gateway.post("/v1/chat/completions", body, key).status_code == 401
    policy = {
        **msgspec.to_builtins(TenantPolicy(name="gamma", models=("tiny",))),
        "requests_per_minute": 5,
    }
    del policy["name"]
    put = httpx.put(f"{gateway.url}/admin/tenants/gamma", json=policy, headers=admin)
    assert put.status_code == 200 and put.json()["requests_per_minute"] == 5
    bad = httpx.put(
        f"{gateway.url}/admin/tenants/gamma", json={**policy, "burst": 3}, headers=admin
    )
    assert bad.status_code == 400 and _error(bad)["param"] == "burst"
    assert httpx.delete(f"{gateway.url}/admin/tenants/gamma", headers=admin).status_code == 204
    assert httpx.delete(f"{gateway.url}/admin/tenants/gamma", headers=admin).status_code == 404
