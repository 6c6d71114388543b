"""Requests and stock configs for the tests of request translation (``adapters.triton.tensors``)."""

from __future__ import annotations

from typing import Any

from adapters.contract import GenerationRequest, LoraAdapter, SamplingParams
from adapters.triton.wire import WireTensor
from tests.support.stock_configs import stock as stock_release
from tests.support.stock_configs import without_token_counts


def stock(name: str, **values: Any) -> dict[str, Any]:
    """The May 2025 layout: new input names, no token counts."""
    return without_token_counts(stock_release(name, **values))


def request(
    stream: bool = False, lora: LoraAdapter | None = None, **params: Any
) -> GenerationRequest:
    params.setdefault("max_tokens", 16)
    return GenerationRequest(
        request_id="r1",
        prompt="Hello, wörld",
        params=SamplingParams(**params),
        stream=stream,
        lora=lora,
    )


def by_name(tensors: list[WireTensor]) -> dict[str, WireTensor]:
    names = [tensor.name for tensor in tensors]
    assert len(names) == len(set(names)), f"duplicate inputs: {names}"
    return {tensor.name: tensor for tensor in tensors}
