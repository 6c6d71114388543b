"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging

import httpx
from litestar import MediaType, Response, get
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.errors import ResourceNotFoundError, ServiceUnavailableError
from gateway.lifecycle import Runtime
from gateway.registry import ServedModel

logger = logging.getLogger(__name__)


@get("/health/live", media_type=MediaType.JSON)
async def live() -> dict[str, str]:
    """The process is up and its event loop answers."""
    return {"status": "ok"}


async def _model_ready(runtime: Runtime, model: ServedModel) -> bool:
    timeout = runtime.settings.limits.readiness_timeout_s
    try:
        return await asyncio.wait_for(runtime.backend.is_ready(model.target), timeout)
    except Exception as exc:
        logger.debug("readiness of %s: %r", model.name, exc)
        return False


@get("/health/ready", media_type=MediaType.JSON)
async def ready(runtime: Runtime) -> Response[dict[str, object]]:
    """200 once every configured model is ready in its Triton; 503 before and while stopping."""
    models = list(runtime.registry)
    accepting = runtime.lifecycle.accepting
    states = await asyncio.gather(*(_model_ready(runtime, m) for m in models)) if accepting else []
    ready_models = {model.name: state for model, state in zip(models, states, strict=False)}
    ok = accepting and bool(models) and all(ready_models.values())
    body: dict[str, object] = {"status": "ready" if ok else "not_ready", "models": ready_models}
    headers = {} if ok else {"Retry-After": str(runtime.settings.limits.retry_after_s)}
    return Response(body, status_code=200 if ok else 503, headers=headers)


@get("/metrics", media_type=CONTENT_TYPE_LATEST)
async def metrics(runtime: Runtime) -> Response[bytes]:
    """Prometheus text exposition of the gateway's own metrics."""
    return Response(runtime.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@get("/metrics/sidecars/{name:str}", media_type=CONTENT_TYPE_LATEST)
async def sidecar_metrics(name: str, runtime: Runtime) -> Response[bytes]:
    """A supervised tritonserver's own metrics (queue and compute times, TensorRT-LLM's KV-cache
    and batch metrics), for a scraper that reaches only the gateway."""
    sidecar = next((s for s in runtime.sidecars if s.name == name), None)
    if sidecar is None:
        raise ResourceNotFoundError(f"No sidecar called {name!r}.", param="name")
    try:
        async with httpx.AsyncClient(timeout=runtime.settings.limits.readiness_timeout_s) as client:
            answer = await client.get(sidecar.metrics_url)
        answer.raise_for_status()
    except httpx.HTTPError as exc:
        raise ServiceUnavailableError(
            f"The metrics of sidecar {name!r} could not be read: {type(exc).__name__}.",
            headers={"Retry-After": str(runtime.settings.limits.retry_after_s)},
        ) from None
    return Response(answer.content, media_type=CONTENT_TYPE_LATEST)
