"""Bounded requests through the gateway on a real sidecar, with the memory store and real Redis:
an oversize request is a 400 naming the field, counted against the tenant's request limit (a
429 once spent); concurrency is counted in engine sequences; ``/v1/models`` lists the bounds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.settings import RequestBounds
from gateway.tenancy import KeyEntry, StoreSettings, TenancySettings, TenantPolicy
from gateway.tenancy.service import digest, new_key
from tests.support.gateway import LiveGateway, sidecar_settings
from tests.support.prometheus import total
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow
BOUNDS = RequestBounds(
    max_choices=8,
    max_prompts=16,
    max_prompt_bytes=4000,
    max_stop_sequences=4,
    max_stop_bytes=64,
    max_guide_bytes=4096,
    max_guide_depth=8,
)
TENANTS = {
    "team": TenantPolicy(name="team", requests_per_minute=6000, tokens_per_minute=50_000),
    "thrice": TenantPolicy(name="thrice", requests_per_minute=3, tokens_per_minute=1000),
    "sixth": TenantPolicy(name="sixth", requests_per_minute=6, burst=1.0),
    "pair": TenantPolicy(name="pair", max_concurrency=2, tokens_per_minute=100_000),
    "wide": TenantPolicy(name="wide", max_choices=12),
}
KEYS = {name: new_key() for name in TENANTS}
HELLO = [{"role": "user", "content": "hello"}]


@dataclass
class Gateway:
    url: str

    def post(self, path: str, body: dict[str, Any], tenant: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
        return httpx.post(f"{self.url}{path}", json=body, headers=headers, timeout=60)

    def in_flight(self, tenant: str) -> float:
        scraped = httpx.get(f"{self.url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"})
        text = scraped.text
        return total(text, "gateway_tenant_requests_in_flight", tenant=tenant)


ADMIN = new_key()
"""The admin key: the metrics are behind it, tenants' names being in them."""


@pytest.fixture(scope="module", params=["memory", "redis"])
def gateway(
    request: pytest.FixtureRequest,
    sidecar: Sidecar,
    tiny_model_dir: Path,
    redis_server: RedisServer,
) -> Iterator[Gateway]:
    store = StoreSettings(kind=request.param, url=redis_server.url, prefix=f"b-{request.param}")
    tenancy = TenancySettings(
        tenants=tuple(TENANTS.values()),
        keys=tuple(KeyEntry(tenant=name, sha256=digest(key)) for name, key in KEYS.items()),
        store=store,
        admin_key_sha256=digest(ADMIN),
    )
    settings = sidecar_settings(sidecar, tiny_model_dir)
    limits = msgspec.structs.replace(settings.limits, bounds=BOUNDS)
    settings = msgspec.structs.replace(settings, limits=limits, tenancy=tenancy)
    live = LiveGateway(settings).start()
    yield Gateway(live.url)
    live.stop()


def _error(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["error"]
    return body


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


def _tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


TEXT = "/v1/completions"
CHAT = "/v1/chat/completions"
OVERSIZE = [
    (TEXT, {"prompt": ["x"] * 200_000, "max_tokens": 1}, "prompt"),
    (TEXT, {"prompt": ["The cat"] * 5, "n": 2, "max_tokens": 1}, "n"),
    (TEXT, {"prompt": "x" * 4001, "max_tokens": 1}, "prompt"),
    (TEXT, {"prompt": "x", "stop": [f"s{i}" for i in range(5)]}, "stop"),
    (CHAT, {"messages": HELLO, "stop": [str(i) for i in range(120_000)]}, "stop"),
    (CHAT, {"messages": HELLO, "stop": ["x" * 65]}, "stop"),
    (CHAT, {"messages": HELLO, "n": 9}, "n"),
    (CHAT, {"messages": [{"role": "user", "content": "y" * 4001}]}, "messages"),
    (
        CHAT,
        {
            "messages": HELLO,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "deep", "schema": _nested(9)},
            },
        },
        "response_format",
    ),
    (
        CHAT,
        {
            "messages": HELLO,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "big", "schema": {"enum": ["v" * 5000]}},
            },
        },
        "response_format",
    ),
    (CHAT, {"messages": HELLO, "tools": [_tool(_nested(9))]}, "tools"),
    (CHAT, {"messages": HELLO, "tools": [_tool({"enum": ["v" * 5000]})]}, "tools"),
]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    OVERSIZE,
    ids=[
        "200000-prompts", "prompts-times-n", "prompt-bytes", "stop-count", "120000-stops",
        "stop-bytes", "chat-n", "message-bytes", "schema-depth", "schema-bytes", "tool-depth",
        "tool-bytes",
    ],
)  # fmt: skip
def test_an_oversize_request_is_a_400_naming_the_field(
    gateway: Gateway, path: str, body: dict[str, Any], param: str
) -> None:
    refused = gateway.post(path, {"model": "tiny", **body}, "team")
    assert refused.status_code == 400, refused.text
    error = _error(refused)
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert "more than" in error["message"] or "deeper than" in error["message"]
    # Counted as a request: the answer says what is left of the limit.
    assert int(refused.headers["x-ratelimit-remaining-requests"]) < 6000


def test_size_refusals_spend_the_request_limit_then_meet_429(gateway: Gateway) -> None:
    """Over a bound, over what the token limit can ever hold, over the stop sequences: each
    refusal takes one of the tenant's three requests a minute, and then the 429 comes."""
    oversize = [
        {"model": "tiny", "prompt": ["x"] * 200_000, "max_tokens": 1},
        {"model": "tiny", "prompt": "x", "max_tokens": 2000},
        {"model": "tiny", "prompt": "x", "max_tokens": 1, "stop": ["s"] * 5},
    ]
    remaining = []
    for body in oversize:
        refused = gateway.post(TEXT, body, "thrice")
        assert refused.status_code == 400, refused.text
        remaining.append(int(refused.headers["x-ratelimit-remaining-requests"]))
    assert remaining == [2, 1, 0]
    for request in (*oversize, {"model": "tiny", "prompt": "The cat", "max_tokens": 1}):
        limited = gateway.post(TEXT, request, "thrice")
        assert limited.status_code == 429
        assert _error(limited)["code"] == "rate_limit_exceeded"
        assert "requests per minute (limit 3)" in _error(limited)["message"]
    # Refused before its body is read: a body over the 4 MiB any request may send is not a 413.
    huge = {"model": "tiny", "prompt": "x" * (5 * 1024 * 1024)}
    assert gateway.post(TEXT, huge, "thrice").status_code == 429


def test_a_prompt_over_the_context_window_is_counted_too(gateway: Gateway) -> None:
    """A prompt over the context window is refused after tokenizing; it is counted as well."""
    body = {"model": "tiny", "prompt": "hello " * 600, "max_tokens": 4000}
    first = gateway.post(TEXT, body, "sixth")
    second = gateway.post(TEXT, body, "sixth")
    assert first.status_code == second.status_code == 400
    assert _error(first)["code"] == "context_length_exceeded"
    assert int(second.headers["x-ratelimit-remaining-requests"]) < int(
        first.headers["x-ratelimit-remaining-requests"]
    )


def test_a_tenants_max_choices_overrides_the_bound(gateway: Gateway) -> None:
    body = {"model": "tiny", "prompt": ["The cat", "A dog", "The sun", "It"], "n": 3}
    wide = gateway.post(TEXT, {**body, "max_tokens": 2}, "wide")
    assert wide.status_code == 200, wide.text
    assert len(wide.json()["choices"]) == 12
    assert gateway.post(TEXT, {**body, "max_tokens": 2}, "team").status_code == 400


def test_concurrency_is_counted_in_sequences(gateway: Gateway) -> None:
    never = gateway.post(CHAT, {"model": "tiny", "messages": HELLO, "n": 3}, "pair")
    assert never.status_code == 400
    assert _error(never)["param"] == "n"
    assert "max_concurrency of 2" in _error(never)["message"]
    body = {
        "model": "tiny",
        "prompt": "The cat",
        "max_tokens": 3000,
        "min_tokens": 3000,
        "n": 2,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {KEYS['pair']}"}
    with (
        httpx.Client(base_url=gateway.url, timeout=60) as client,
        client.stream("POST", TEXT, json=body, headers=headers) as held,
    ):
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: an iterator let go of hangs the stream up
        next(line for line in lines if line.startswith("data: "))
        # Two sequences run: a third is over the tenant's two, though it is a second request.
        third = gateway.post(TEXT, {"model": "tiny", "prompt": "x", "max_tokens": 1}, "pair")
        assert third.status_code == 429
        assert "sequences in flight at once (limit 2)" in _error(third)["message"]
    deadline = time.monotonic() + 20
    while gateway.in_flight("pair") > 0:
        assert time.monotonic() < deadline, "the lease was not released"
        time.sleep(0.05)
    after = gateway.post(TEXT, {"model": "tiny", "prompt": "x", "max_tokens": 1, "n": 2}, "pair")
    assert after.status_code == 200, after.text


def test_the_models_list_the_bounds(gateway: Gateway) -> None:
    def limits(tenant: str) -> dict[str, int]:
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
        listed = httpx.get(f"{gateway.url}/v1/models", headers=headers).json()["data"]
        one = httpx.get(f"{gateway.url}/v1/models/tiny", headers=headers).json()
        tiny = next(card for card in listed if card["id"] == "tiny")
        assert tiny["limits"] == one["limits"]
        found: dict[str, int] = tiny["limits"]
        return found

    assert limits("team") == {
        "max_choices": 8,
        "max_n": 8,
        "max_prompts": 16,
        "max_prompt_bytes": 4000,
        "max_stop_sequences": 4,
        "max_stop_bytes": 64,
        "max_guide_bytes": 4096,
        "max_guide_depth": 8,
    }
    assert limits("wide")["max_choices"] == 12
