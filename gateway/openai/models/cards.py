"""The model cards of ``/v1/models``: a served model's, and a LoRA adapter's on its base."""

from __future__ import annotations

import msgspec

from gateway.catalog.lora import LoadedAdapter
from gateway.catalog.registry import ServedModel
from gateway.openai.bounds import Bounds
from gateway.openai.protocol import ModelCard


def model_card(model: ServedModel, max_choices: int | None = None) -> ModelCard:
    """A served model as ``/v1/models`` lists it, with the bounds of a caller whose
    ``max_choices`` (a tenant's own) overrides the model's."""
    bounds = Bounds.of(model.route.bounds, model.route.max_n, max_choices)
    return ModelCard(
        id=model.name,
        created=model.created,
        owned_by=model.route.owned_by,
        max_model_len=model.context_length,
        parent=model.base,
        input_modalities=["text", "image"] if model.vision is not None else ["text"],
        limits=bounds.listed(),
    )


def adapter_card(
    adapter: LoadedAdapter, base: ServedModel, *, admin: bool, max_choices: int | None = None
) -> ModelCard:
    """An adapter as ``/v1/models`` lists it; only the admin sees its folder (``root``), a path
    on the server."""
    card = msgspec.structs.replace(
        model_card(base, max_choices), id=adapter.name, created=adapter.created, parent=base.name
    )
    return msgspec.structs.replace(card, root=adapter.path) if admin else card
