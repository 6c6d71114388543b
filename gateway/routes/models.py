"""``GET /v1/models`` and ``GET /v1/models/{id}``."""

from __future__ import annotations

import msgspec
from litestar import get

from gateway.lora import LoadedAdapter
from gateway.protocol import ModelCard, ModelList
from gateway.registry import ModelRegistry, ServedModel
from gateway.tenancy import TenantPolicy


def _card(model: ServedModel) -> ModelCard:
    return ModelCard(
        id=model.name,
        created=model.created,
        owned_by=model.route.owned_by,
        max_model_len=model.context_length,
        parent=model.base,
    )


def _adapter_card(adapter: LoadedAdapter, base: ServedModel) -> ModelCard:
    card = _card(base)
    return msgspec.structs.replace(
        card, id=adapter.name, created=adapter.created, root=adapter.path, parent=base.name
    )


@get("/v1/models")
async def list_models(registry: ModelRegistry, tenant: TenantPolicy) -> ModelList:
    """Every served model and LoRA adapter the caller may use; adapters name their parent."""
    cards = [_card(model) for model in registry if tenant.allows_model(model.name)]
    for adapter in registry.adapters:
        base = registry.base_model(adapter.base)
        visible = base is not None and tenant.allows_model(base.name)
        if base is not None and visible and tenant.allows_adapter(adapter.name):
            cards.append(_adapter_card(adapter, base))
    return ModelList(data=cards)


@get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, registry: ModelRegistry, tenant: TenantPolicy) -> ModelCard:
    """One served model or adapter; ids may contain slashes."""
    name = model_id.lstrip("/")
    model = registry.get(name, tenant.allows_model, tenant.allows_adapter)
    found = registry.adapters.find(name)
    base = registry.base_model(model.base) if model.base is not None else None
    if base is not None and found is not None:
        return _adapter_card(found, base)
    return _card(model)
