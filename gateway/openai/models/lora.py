"""vLLM's run-time LoRA endpoints, on the admin router (behind the admin key):
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``. With the Redis store a load or
unload reaches every worker and replica sharing it (``board``); with the memory store it is this
process's alone. Either way it lasts until the gateway stops (or, with Redis, until it is
unloaded): adapters every replica must always serve belong in the settings file."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, post
from litestar.response import Response

from gateway.catalog.lora import AdapterError, AdapterExists
from gateway.catalog.lora.board import AdapterBoard
from gateway.catalog.registry import ModelRegistry
from gateway.errors import InvalidRequestError, ResourceNotFoundError
from gateway.http.answers import decode_body
from gateway.openai.models.cards import adapter_card
from gateway.openai.protocol import ModelCard


class LoadAdapter(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Body of ``POST /v1/load_lora_adapter``."""

    lora_name: str
    lora_path: str
    base_model: str | None = None
    """The model the adapter runs on; may be left out when the gateway serves one model."""


class UnloadAdapter(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Body of ``POST /v1/unload_lora_adapter``."""

    lora_name: str
    lora_int_id: int | None = None


@post("/v1/load_lora_adapter", status_code=200)
async def load_lora_adapter(
    request: Request[Any, Any, Any], registry: ModelRegistry, board: AdapterBoard
) -> ModelCard:
    """Load a TensorRT-LLM or PEFT adapter folder and serve it under ``lora_name``; the answer
    is the adapter's card as the admin's ``/v1/models`` lists it."""
    body = decode_body(await request.body(), LoadAdapter)
    bases = [model.name for model in registry]
    base_name = body.base_model or (bases[0] if len(bases) == 1 else None)
    if base_name is None:
        raise InvalidRequestError(
            f"base_model is required: this gateway serves {', '.join(bases)}", param="base_model"
        )
    base = registry.base_model(base_name)
    if base is None:
        raise InvalidRequestError(f"No base model called {base_name!r}.", param="base_model")
    if base_name == body.lora_name:
        raise InvalidRequestError("An adapter cannot take a model's name.", param="lora_name")
    try:
        adapter = await board.load(body.lora_name, body.lora_path, base.name)
    except AdapterExists as exc:
        raise InvalidRequestError(str(exc), param="lora_name") from None
    except AdapterError as exc:
        raise InvalidRequestError(str(exc), param="lora_path") from None
    return adapter_card(adapter, base, admin=True)


@post("/v1/unload_lora_adapter", status_code=200)
async def unload_lora_adapter(
    request: Request[Any, Any, Any], board: AdapterBoard
) -> Response[str]:
    """Stop serving an adapter (requests already running finish on it)."""
    body = decode_body(await request.body(), UnloadAdapter)
    if not await board.unload(body.lora_name):
        raise ResourceNotFoundError(
            f"The lora adapter '{body.lora_name}' cannot be found.", param="lora_name"
        )
    return Response(
        f"Success: LoRA adapter '{body.lora_name}' removed successfully.", media_type="text/plain"
    )


ROUTES = [load_lora_adapter, unload_lora_adapter]
