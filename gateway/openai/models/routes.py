"""``GET /v1/models`` and ``GET /v1/models/{id}``.

A tenant sees the models and adapters it may use, by name and parent; only the admin key also
sees the folder each adapter was loaded from (``root``), a path on the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Request, get
from litestar.datastructures import State

from gateway.catalog.lora import LoadedAdapter
from gateway.catalog.registry import ModelRegistry, ServedModel
from gateway.openai.models.cards import adapter_card, model_card
from gateway.openai.protocol import ModelCard, ModelList
from gateway.tenancy import TenantPolicy
from gateway.tenancy.service import Tenancy


@dataclass(frozen=True, slots=True)
class Audience:
    """Who asks: a tenant, or the administrator (every model, and the adapters' folders)."""

    tenant: TenantPolicy
    admin: bool = False


ADMINISTRATOR = Audience(TenantPolicy(name="admin"), admin=True)


def audience(request: Request[Any, Any, Any], state: State) -> Audience:
    """The caller: the administrator (admin key) or the tenant its key names."""
    tenancy: Tenancy = state.runtime.tenancy
    if tenancy.is_admin(request.headers):
        return ADMINISTRATOR
    return Audience(tenancy.authenticate(request.headers))


def _adapter_card(adapter: LoadedAdapter, base: ServedModel, audience: Audience) -> ModelCard:
    return adapter_card(
        adapter, base, admin=audience.admin, max_choices=audience.tenant.max_choices
    )


@get("/v1/models")
async def list_models(registry: ModelRegistry, audience: Audience) -> ModelList:
    """Every served model and LoRA adapter the caller may use; adapters name their parent."""
    tenant = audience.tenant
    cards = [
        model_card(model, tenant.max_choices)
        for model in registry
        if tenant.allows_model(model.name)
    ]
    for adapter in registry.adapters:
        base = registry.base_model(adapter.base)
        visible = base is not None and tenant.allows_model(base.name)
        if base is not None and visible and tenant.allows_adapter(adapter.name):
            cards.append(_adapter_card(adapter, base, audience))
    return ModelList(data=cards)


@get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, registry: ModelRegistry, audience: Audience) -> ModelCard:
    """One served model or adapter; ids may contain slashes."""
    name = model_id.lstrip("/")
    tenant = audience.tenant
    model = registry.get(name, tenant)
    found = registry.adapters.find(name)
    base = registry.base_model(model.base) if model.base is not None else None
    if base is not None and found is not None:
        return _adapter_card(found, base, audience)
    return model_card(model, tenant.max_choices)
