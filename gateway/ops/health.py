"""Liveness and readiness."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from litestar import MediaType, Request, Response, get

from gateway.catalog.registry import ServedModel
from gateway.runtime.base import Runtime

logger = logging.getLogger(__name__)


@get("/health/live", media_type=MediaType.JSON)
async def live() -> dict[str, str]:
    """The process is up and its event loop answers."""
    return {"status": "ok"}


async def _model_ready(runtime: Runtime, model: ServedModel) -> bool:
    pool = runtime.router.pool(model.name)
    if pool is not None:
        # Its probes keep the answer current: at least one replica takes requests.
        return pool.ready()
    timeout = runtime.settings.limits.readiness_timeout_s
    try:
        return await asyncio.wait_for(runtime.backend.is_ready(model.target), timeout)
    except Exception as exc:
        logger.debug("readiness of %s: %r", model.name, exc)
        return False


@get("/health/ready", media_type=MediaType.JSON)
async def ready(request: Request[Any, Any, Any], runtime: Runtime) -> Response[dict[str, object]]:
    """200 once every configured model is ready in its Triton (at least one replica of a model
    with several); 503 before and while stopping. Anyone (a Kubernetes probe) reads the status;
    the readiness of each model only the admin key, or anyone while auth is off (then
    ``/v1/models`` lists every model to anyone anyway)."""
    models = list(runtime.registry)
    accepting = runtime.lifecycle.accepting
    states = await asyncio.gather(*(_model_ready(runtime, m) for m in models)) if accepting else []
    ready_models = {model.name: state for model, state in zip(models, states, strict=False)}
    ok = accepting and bool(models) and all(ready_models.values())
    body: dict[str, object] = {"status": "ready" if ok else "not_ready"}
    tenancy = runtime.tenancy
    if not tenancy.settings.auth or tenancy.is_admin(request.headers):
        body["models"] = ready_models
    headers = {} if ok else {"Retry-After": str(runtime.settings.limits.retry_after_s)}
    return Response(body, status_code=200 if ok else 503, headers=headers)
