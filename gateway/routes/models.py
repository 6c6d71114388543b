"""``GET /v1/models`` and ``GET /v1/models/{id}``."""

from __future__ import annotations

from litestar import get

from gateway.protocol import ModelCard, ModelList
from gateway.registry import ModelRegistry, ServedModel
from gateway.tenancy import TenantPolicy


def _card(model: ServedModel) -> ModelCard:
    return ModelCard(
        id=model.name,
        created=model.created,
        owned_by=model.route.owned_by,
        max_model_len=model.context_length,
    )


@get("/v1/models")
async def list_models(registry: ModelRegistry, tenant: TenantPolicy) -> ModelList:
    """Every served model the caller may use."""
    return ModelList(data=[_card(model) for model in registry if tenant.allows_model(model.name)])


@get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, registry: ModelRegistry, tenant: TenantPolicy) -> ModelCard:
    """One served model; ids may contain slashes."""
    return _card(registry.get(model_id.lstrip("/"), tenant.allows_model))
