"""LoRA adapters by model name through the gateway, the real tritonserver sidecar and the engine.

Two adapters made with ``peft`` on the tiny model must give Hugging Face + PEFT's greedy output
through the ``ensemble`` (whose engine keeps one adapter in its LoRA cache, so most requests
meet an eviction) and through the BLS, streaming and not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import openai
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.settings import AdapterSettings, ModelSettings, Settings
from gateway.tenancy.config import KeyEntry, TenancySettings, TenantPolicy
from gateway.tenancy.service import digest, new_key
from tests.support.gateway import LiveGateway, sidecar_settings
from tests.support.lora import peft_greedy
from tests.support.prometheus import total

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox"
MAX_TOKENS = 12
KEYS = {"all": new_key(), "limited": new_key()}
ADMIN_KEY = new_key()
SCRAPER = {"Authorization": f"Bearer {ADMIN_KEY}"}
VARIANTS = [None, "lora-a", "lora-b"]


@pytest.fixture(scope="module")
def references(tiny_model_dir: Path, adapters: dict[str, Path]) -> dict[str | None, str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tokenizer.encode(PROMPT)
    texts = {
        name: tokenizer.decode(
            peft_greedy(tiny_model_dir, adapters.get(name or ""), prompt, MAX_TOKENS)
        )
        for name in VARIANTS
    }
    assert len(set(texts.values())) == len(VARIANTS), "the adapters must change the output"
    return texts


@pytest.fixture(scope="module")
def gateway(
    sidecar: Sidecar, tiny_model_dir: Path, adapters: dict[str, Path]
) -> Iterator[LiveGateway]:
    base = sidecar_settings(sidecar, tiny_model_dir)

    def with_adapters(model: ModelSettings, suffix: str) -> ModelSettings:
        entries = tuple(
            AdapterSettings(name=f"{name}{suffix}", path=str(path))
            for name, path in adapters.items()
        )
        return msgspec.structs.replace(model, adapters=entries)

    ensemble, bls = base.models[0], base.models[1]
    tenancy = TenancySettings(
        tenants=(
            TenantPolicy(name="all"),
            TenantPolicy(name="limited", adapters=("lora-a*",)),
        ),
        keys=tuple(KeyEntry(tenant=name, sha256=digest(key)) for name, key in KEYS.items()),
        admin_key_sha256=digest(ADMIN_KEY),
    )
    settings = Settings(
        models=(with_adapters(ensemble, ""), with_adapters(bls, "-bls")),
        limits=base.limits,
        tenancy=tenancy,
    )
    live = LiveGateway(settings).start()
    yield live
    live.stop()


def _client(gateway: LiveGateway, tenant: str = "all") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEYS[tenant], max_retries=0)


def _complete(client: openai.OpenAI, model: str, *, stream: bool) -> tuple[str, str]:
    """The text and the model name the answer carries."""
    params = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0}
    if not stream:
        reply = client.completions.create(model=model, **params)
        return reply.choices[0].text, reply.model
    chunks = list(client.completions.create(model=model, stream=True, **params))
    return "".join(c.choices[0].text for c in chunks if c.choices), chunks[0].model


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("base", "suffix"), [("tiny", ""), ("tiny-bls", "-bls")])
def test_adapters_give_the_peft_output(
    gateway: LiveGateway,
    references: dict[str | None, str],
    base: str,
    suffix: str,
    stream: bool,
) -> None:
    client = _client(gateway)
    for variant in VARIANTS:
        name = base if variant is None else f"{variant}{suffix}"
        text, model = _complete(client, name, stream=stream)
        assert (text, model) == (references[variant], name)
    text, model = _complete(client, f"{base}:lora-a{suffix}", stream=stream)
    assert (text, model) == (references["lora-a"], f"{base}:lora-a{suffix}")


def test_24_concurrent_mixed_requests_on_an_engine_that_caches_one_adapter(
    gateway: LiveGateway, references: dict[str | None, str]
) -> None:
    async def run() -> list[tuple[str | None, str]]:
        client = openai.AsyncOpenAI(
            base_url=f"{gateway.url}/v1", api_key=KEYS["all"], max_retries=0
        )

        async def one(variant: str | None, stream: bool) -> tuple[str | None, str]:
            params = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0}
            model = variant or "tiny"
            if stream:
                parts = [
                    c.choices[0].text
                    async for c in await client.completions.create(
                        model=model, stream=True, **params
                    )
                    if c.choices
                ]
                return variant, "".join(parts)
            reply = await client.completions.create(model=model, **params)
            return variant, reply.choices[0].text

        try:
            return await asyncio.gather(
                *(one(VARIANTS[i % 3], stream=i % 2 == 0) for i in range(24))
            )
        finally:
            await client.close()

    for variant, text in asyncio.run(run()):
        assert text == references[variant], variant


def test_alternating_adapters_through_a_cache_of_one(
    gateway: LiveGateway, references: dict[str | None, str]
) -> None:
    client = _client(gateway)
    for turn in range(6):
        variant = "lora-a" if turn % 2 == 0 else "lora-b"
        assert _complete(client, variant, stream=turn % 3 == 0)[0] == references[variant]


def test_models_lists_adapters_with_their_parent_for_those_who_may_use_them(
    gateway: LiveGateway,
) -> None:
    every = {m.id: m for m in _client(gateway).models.list().data}
    assert {"tiny", "lora-a", "lora-b", "tiny-bls", "lora-a-bls", "lora-b-bls"} <= set(every)
    assert every["lora-a"].model_extra["parent"] == "tiny"
    assert every["lora-b-bls"].model_extra["parent"] == "tiny-bls"
    assert every["tiny"].model_extra["parent"] is None
    limited = _client(gateway, "limited")
    names = {m.id for m in limited.models.list().data}
    assert {"lora-a", "lora-a-bls"} <= names and not {"lora-b", "lora-b-bls"} & names
    assert limited.models.retrieve("lora-a").model_extra["parent"] == "tiny"
    for model in ("lora-b", "tiny:lora-b", "lora-c", "tiny-bls:lora-a"):
        with pytest.raises(openai.NotFoundError) as caught:
            limited.completions.create(model=model, prompt=PROMPT, max_tokens=2)
        assert caught.value.code == "model_not_found"


def test_only_the_admin_key_sees_where_adapters_were_loaded_from(
    gateway: LiveGateway, adapters: dict[str, Path]
) -> None:
    folders = [str(path) for path in adapters.values()]
    tenant = {"Authorization": f"Bearer {KEYS['all']}"}
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for path in ("/v1/models", "/v1/models/lora-a", "/v1/models/tiny:lora-a"):
        shown = httpx.get(f"{gateway.url}{path}", headers=tenant)
        assert shown.status_code == 200
        assert "root" not in shown.text and not any(folder in shown.text for folder in folders)
    listed = httpx.get(f"{gateway.url}/v1/models", headers=admin).json()["data"]
    roots = {card["id"]: card.get("root") for card in listed}
    assert roots["lora-a"] == roots["lora-a-bls"] == str(adapters["lora-a"])
    assert roots["lora-b"] == str(adapters["lora-b"]) and roots["tiny"] is None
    one = httpx.get(f"{gateway.url}/v1/models/lora-b-bls", headers=admin).json()
    assert (one["root"], one["parent"]) == (str(adapters["lora-b"]), "tiny-bls")


def test_metrics_name_an_adapter_one_way_whatever_the_client_called_it(
    gateway: LiveGateway,
) -> None:
    def served(adapter: str) -> float:
        text = httpx.get(f"{gateway.url}/metrics", headers=SCRAPER).text
        return total(text, "gateway_generation_requests_total", adapter=adapter, model="tiny")

    before = served("lora-b")
    client = _client(gateway)
    for name in ("lora-b", "tiny:lora-b"):
        client.completions.create(model=name, prompt=PROMPT, max_tokens=2)
    assert served("lora-b") - before == 2
    assert 'adapter="tiny:lora-b"' not in httpx.get(f"{gateway.url}/metrics", headers=SCRAPER).text


def test_adapters_load_and_unload_at_run_time_with_the_admin_key(
    gateway: LiveGateway, adapters: dict[str, Path], references: dict[str | None, str]
) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    body = {"lora_name": "lora-c", "lora_path": str(adapters["lora-b"]), "base_model": "tiny"}
    url = gateway.url
    tenant = {"Authorization": f"Bearer {KEYS['all']}"}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers=tenant).status_code == 401
    loaded = httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers=admin)
    assert loaded.status_code == 200, loaded.text
    card = loaded.json()
    assert (card["id"], card["object"], card["parent"]) == ("lora-c", "model", "tiny")
    assert httpx.get(f"{url}/v1/models/lora-c", headers=admin).json() == card
    listed = httpx.get(f"{url}/v1/models", headers=admin).json()["data"]
    assert card in listed
    assert _complete(_client(gateway), "lora-c", stream=True)[0] == references["lora-b"]
    again = httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers=admin)
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]

    unload = {"lora_name": "lora-c"}
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json=unload, headers=admin).is_success
    with pytest.raises(openai.NotFoundError):
        _complete(_client(gateway), "lora-c", stream=False)
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json=unload, headers=admin)
    assert gone.status_code == 404

    bad = {**body, "lora_path": str(adapters["lora-b"].parent / "nowhere")}
    refused = httpx.post(f"{url}/v1/load_lora_adapter", json=bad, headers=admin)
    assert refused.status_code == 400
    assert "nowhere: no such adapter folder" in refused.json()["error"]["message"]
    ambiguous = {"lora_name": "lora-d", "lora_path": str(adapters["lora-a"])}
    refused = httpx.post(f"{url}/v1/load_lora_adapter", json=ambiguous, headers=admin)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "base_model"


def test_other_releases_serve_adapters_where_their_models_carry_them(
    sidecar: Sidecar,
    tiny_model_dir: Path,
    adapters: dict[str, Path],
    references: dict[str | None, str],
) -> None:
    """tiny2 renders v0.19's configs (LoRA inputs everywhere); tiny3 renders v0.8's, whose
    ensemble has no LoRA inputs at all: a clear 400 there, not a failure in Triton."""
    base = sidecar_settings(sidecar, tiny_model_dir)
    served = {m.name: m for m in base.models}
    models = tuple(
        msgspec.structs.replace(
            served[name], adapters=(AdapterSettings(name=adapter, path=str(adapters["lora-a"])),)
        )
        for name, adapter in (("tiny2-bls", "a-on-v0.19"), ("tiny3", "a-on-v0.8"))
    )
    live = LiveGateway(msgspec.structs.replace(base, models=models)).start()
    try:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
        for stream in (False, True):
            assert _complete(client, "a-on-v0.19", stream=stream)[0] == references["lora-a"]
        with pytest.raises(openai.BadRequestError) as caught:
            _complete(client, "a-on-v0.8", stream=False)
        assert "does not serve LoRA adapters" in caught.value.message
        assert "tiny3" not in caught.value.message  # the Triton model's name is the log's
    finally:
        live.stop()
