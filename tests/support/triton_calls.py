"""Calls of the Triton backend against the test sidecar's models: where each model is (its
entry kind, over either transport) and the greedy requests the backend's tests send it."""

from __future__ import annotations

import dataclasses
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from adapters.contract import (
    EntryModel,
    GenerationRequest,
    ModelTarget,
    SamplingParams,
    TokenChunk,
)
from adapters.triton import TritonBackend
from deploy.sidecar.models import ensure_tiny_model
from deploy.sidecar.supervisor import Sidecar
from gateway.catalog.text.prompts import PromptTokenizer

PROMPT = "def add(a, b):\n"
ENTRIES = ["tiny_ensemble", "tiny_tensorrt_llm_bls", "tiny_tensorrt_llm"]
"""One model of each entry kind: the ensemble, the BLS, and the engine itself."""
LONG = 3000
"""Tokens a runaway generation would still produce: many seconds of engine work."""

TRANSPORTS = ["grpc", "http"]
"""gRPC ``ModelStreamInfer``, or HTTP ``generate_stream`` (the default where Triton's HTTP
address is known)."""


def target(sidecar: Sidecar, model: str, transport: str = "grpc") -> ModelTarget:
    kind: EntryModel = "tensorrt_llm_bls"
    if model.endswith("_ensemble"):
        kind = "ensemble"
    elif model.endswith("_tensorrt_llm"):
        kind = "tensorrt_llm"
    http = sidecar.http_url if transport == "http" else None
    return ModelTarget(url=sidecar.grpc_url, triton_model=model, kind=kind, http_url=http)


@functools.cache
def tiny_tokens() -> PromptTokenizer:
    """The tiny model's tokenizer, as the gateway loads it."""
    return PromptTokenizer.load(str(ensure_tiny_model()), ThreadPoolExecutor(1))


def addressed(where: ModelTarget, request: GenerationRequest) -> GenerationRequest:
    """The request with its token ids and tokenizer when it goes to the engine itself."""
    if where.kind != "tensorrt_llm":
        return request
    tokens = tiny_tokens()
    return dataclasses.replace(
        request, prompt_ids=tokens._prompt(request.prompt).ids, tokens=tokens
    )


def greedy(
    max_tokens: int, *, stream: bool, timeout_s: float = 60.0, **params: Any
) -> GenerationRequest:
    return GenerationRequest(
        request_id="test",
        prompt=PROMPT,
        params=SamplingParams(max_tokens=max_tokens, **{"top_k": 1, "seed": 0, **params}),
        stream=stream,
        timeout_s=timeout_s,
    )


async def collect(
    backend: TritonBackend, where: ModelTarget, request: GenerationRequest
) -> list[TokenChunk]:
    return [chunk async for chunk in backend.generate(where, addressed(where, request))]
