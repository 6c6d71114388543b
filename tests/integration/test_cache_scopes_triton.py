"""KV-cache scopes through the gateway, the real tritonserver and the torch engine: one tenant's
cached prompts are never another's (``cached_tokens`` 0), a scope that tenants name is shared,
LoRA adapters still reuse within a scope, and a stock config without ``cache_salt_id`` is refused
to scoped tenants unless the operator lets them share it."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.settings import AdapterSettings, Settings
from gateway.tenancy.config import KeyEntry, TenancySettings, TenantPolicy
from gateway.tenancy.service import digest, new_key
from tests.support.engine_grpc import Stream, request
from tests.support.gateway import (
    ACCUMULATING_BLS_MODEL,
    BLS_MODEL,
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    LiveGateway,
    sidecar_settings,
)

pytestmark = pytest.mark.slow

SYSTEM = "You are a careful assistant who answers briefly and keeps every secret. " * 10
TENANTS = (
    TenantPolicy(name="team-a"),
    TenantPolicy(name="team-b"),
    TenantPolicy(name="pub-1", cache_scope="public"),
    TenantPolicy(name="pub-2", cache_scope="public"),
)
KEYS = {tenant.name: new_key() for tenant in TENANTS}
UNSHARED_STOCK = "tiny2-unshared"
"""The v0.19 pipeline's BLS (a stock config: no ``cache_salt_id``) without ``shared_kv_cache``."""


@pytest.fixture(scope="module")
def gateway(
    sidecar: Sidecar, tiny_model_dir: Path, adapters: dict[str, Path]
) -> Iterator[LiveGateway]:
    base = sidecar_settings(sidecar, tiny_model_dir)
    by_name = {model.name: model for model in base.models}
    ensemble = msgspec.structs.replace(
        by_name[ENSEMBLE_MODEL],
        adapters=tuple(AdapterSettings(name=n, path=str(p)) for n, p in adapters.items()),
    )
    unshared = msgspec.structs.replace(
        by_name[ACCUMULATING_BLS_MODEL], name=UNSHARED_STOCK, shared_kv_cache=False
    )
    models = (ensemble, by_name[BLS_MODEL], by_name[ENGINE_MODEL])
    settings = Settings(
        models=(*models, by_name[ACCUMULATING_BLS_MODEL], unshared),
        limits=base.limits,
        tenancy=TenancySettings(
            tenants=TENANTS,
            keys=tuple(KeyEntry(tenant=name, sha256=digest(key)) for name, key in KEYS.items()),
        ),
    )
    live = LiveGateway(settings).start()
    yield live
    live.stop()


def _system(tag: str) -> str:
    """A system prompt whose first block no other test shares."""
    return f"[{hashlib.blake2s(tag.encode()).hexdigest()[:12]}] {SYSTEM}"


def _chat(
    gateway: LiveGateway, tenant: str, model: str, system: str, **extra: Any
) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi?"}],
        "max_tokens": 4,
        "temperature": 0,
        **extra,
    }
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def _cached(gateway: LiveGateway, tenant: str, model: str, system: str, **extra: Any) -> int:
    response = _chat(gateway, tenant, model, system, **extra)
    assert response.status_code == 200, response.text
    usage: dict[str, Any] = response.json()["usage"]
    cached: int = usage["prompt_tokens_details"]["cached_tokens"]
    return cached


@pytest.mark.parametrize(
    "model", [ENSEMBLE_MODEL, BLS_MODEL, ENGINE_MODEL, "lora-a"], ids=lambda m: m
)
def test_a_tenant_never_reads_another_tenants_cached_prompt(
    gateway: LiveGateway, model: str
) -> None:
    system = _system(f"own {model}")
    assert _cached(gateway, "team-a", model, system) == 0
    assert _cached(gateway, "team-a", model, system) > 0  # its own repeat is cached
    assert _cached(gateway, "team-b", model, system) == 0  # the same prompt, another scope
    assert _cached(gateway, "team-b", model, system) > 0


@pytest.mark.parametrize("model", [ENSEMBLE_MODEL, BLS_MODEL, ENGINE_MODEL, "lora-a"])
def test_tenants_naming_one_scope_share_it(gateway: LiveGateway, model: str) -> None:
    system = _system(f"public {model}")
    assert _cached(gateway, "pub-1", model, system) == 0
    assert _cached(gateway, "pub-2", model, system) > 0
    assert _cached(gateway, "team-a", model, system) == 0


def test_a_client_cache_salt_narrows_the_tenants_scope(gateway: LiveGateway) -> None:
    system = _system("client salt")
    assert _cached(gateway, "team-a", ENSEMBLE_MODEL, system) == 0
    assert _cached(gateway, "team-a", ENSEMBLE_MODEL, system, cache_salt="mine") == 0
    assert _cached(gateway, "team-a", ENSEMBLE_MODEL, system, cache_salt="mine") > 0
    # The same client salt from another tenant stays in that tenant's scope.
    assert _cached(gateway, "team-b", ENSEMBLE_MODEL, system, cache_salt="mine") == 0
    # A model that cannot salt does not ignore it.
    refused = _chat(gateway, "team-a", ACCUMULATING_BLS_MODEL, system, cache_salt="mine")
    assert refused.status_code == 400


def test_an_adapter_does_not_reuse_the_base_models_blocks_within_a_scope(
    gateway: LiveGateway,
) -> None:
    system = _system("adapter within a scope")
    assert _cached(gateway, "team-a", ENSEMBLE_MODEL, system) == 0
    assert _cached(gateway, "team-a", "lora-a", system) == 0
    assert _cached(gateway, "team-a", "lora-a", system) > 0


def test_a_stock_config_is_refused_to_scoped_tenants_unless_shared(gateway: LiveGateway) -> None:
    response = _chat(gateway, "team-a", UNSHARED_STOCK, _system("stock"))
    assert response.status_code == 400
    error = response.json()["error"]
    assert "not configured to keep them apart" in error["message"] and error["param"] == "model"
    assert "cache_salt_id" not in error["message"]
    system = _system("stock shared")
    assert _cached(gateway, "team-a", ACCUMULATING_BLS_MODEL, system) == 0
    # The operator's shared_kv_cache: every tenant shares the model's cache.
    assert _cached(gateway, "team-b", ACCUMULATING_BLS_MODEL, system) > 0


def _reused_blocks(sidecar: Sidecar, prompt: tuple[int, ...], **extra: Any) -> int:
    values = request(2, prompt, end_id=-1, return_perf_metrics=True, **extra)
    responses = Stream(sidecar, values, model="tiny_tensorrt_llm").collect()
    ((outputs, _),) = [r for r in responses if r[0]]
    return int(outputs["kv_cache_reused_blocks"][0, 0])


def test_the_engine_takes_cache_salt_id_as_tensorrt_llm_does(sidecar: Sidecar) -> None:
    prompt = tuple(range(300, 300 + 129))  # four full blocks of 32 before the last token

    def salt(value: int) -> Any:
        return np.array([[value]], np.uint64)

    assert _reused_blocks(sidecar, prompt, cache_salt_id=salt(2**64 - 1)) == 0
    assert _reused_blocks(sidecar, prompt, cache_salt_id=salt(2**64 - 1)) == 4
    assert _reused_blocks(sidecar, prompt, cache_salt_id=salt(1)) == 0
    assert _reused_blocks(sidecar, prompt) == 0


def test_the_gateway_warns_at_start_of_a_model_it_will_refuse(
    sidecar: Sidecar, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = sidecar_settings(sidecar, tiny_model_dir)
    (stock,) = [m for m in base.models if m.name == ACCUMULATING_BLS_MODEL]
    settings = Settings(
        models=(msgspec.structs.replace(stock, shared_kv_cache=False),),
        limits=base.limits,
        tenancy=TenancySettings(
            tenants=TENANTS[:1], keys=(KeyEntry(tenant="team-a", sha256=digest(KEYS["team-a"])),)
        ),
    )
    with caplog.at_level(logging.WARNING, logger="gateway.runtime"):
        live = LiveGateway(settings).start()
        try:
            deadline = time.monotonic() + 30
            while "declares no cache_salt_id" not in caplog.text:
                assert time.monotonic() < deadline, "no warning at start"
                time.sleep(0.1)
        finally:
            live.stop()
    assert ACCUMULATING_BLS_MODEL in caplog.text


def test_image_rows_keep_salting_blocks_inside_a_scope(
    sidecar: Sidecar, tiny_model_dir: Path
) -> None:
    """A prompt with prompt-table rows (what an image becomes): reused under its own salt with
    the same rows, not with other rows, and not under another salt."""
    config = json.loads((tiny_model_dir / "config.json").read_text())
    vocab, hidden = int(config["vocab_size"]), int(config["hidden_size"])
    rows = np.random.default_rng(5).standard_normal((8, hidden)).astype(np.float16)
    prompt = (*range(700, 716), *range(vocab, vocab + 8), *range(716, 821))

    def reused(table: Any, salt: int) -> int:
        return _reused_blocks(
            sidecar,
            prompt,
            cache_salt_id=np.array([[salt]], np.uint64),
            prompt_embedding_table=table[np.newaxis],
            prompt_vocab_size=np.array([[len(table)]], np.int32),
        )

    assert reused(rows, 11) == 0
    assert reused(rows, 11) == 4
    assert reused(rows[::-1].copy(), 11) == 0  # other image content, same scope
    assert reused(rows, 12) == 0  # the same image, another scope
