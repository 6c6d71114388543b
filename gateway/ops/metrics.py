"""Prometheus metrics: the gateway's own and its sidecars', for whoever the settings let in.

They sit behind the admin key whenever one is set (tenant names, adapter names and Triton's
model names are label values, so tenants must not read them); ``observability.metrics.auth:
none`` opens them to whoever reaches the port; ``observability.metrics.port`` moves them off
the API port onto one of their own (``metrics_app``), which a load balancer in front of the API
never reaches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from litestar import Litestar, Request, Response, Router, get
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.di import Provide
from litestar.handlers import BaseRouteHandler
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.errors import ResourceNotFoundError, ServiceUnavailableError
from gateway.runtime.base import Runtime
from gateway.settings import Settings


async def scraper(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Let through whoever ``observability.metrics.auth`` allows."""
    runtime: Runtime = connection.app.state["runtime"]
    if metrics_need_admin_key(runtime.settings):
        runtime.tenancy.authenticate_admin(connection.headers)


def metrics_need_admin_key(settings: Settings) -> bool:
    """Whether only the admin key reads the metrics: ``admin``, or ``auto`` with a key set or
    tenants' keys checked (where no admin key is set, nobody reads them: tenants' names and
    counts are in them)."""
    auth = settings.observability.metrics.auth
    has_key = settings.tenancy.admin_key_sha256 is not None
    return auth == "admin" or (auth == "auto" and (has_key or settings.tenancy.auth))


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
        answer = await runtime.http.get(
            sidecar.metrics_url, timeout=runtime.settings.limits.readiness_timeout_s
        )
        answer.raise_for_status()
    except httpx.HTTPError as exc:
        raise ServiceUnavailableError(
            f"The metrics of sidecar {name!r} could not be read: {type(exc).__name__}.",
            headers={"Retry-After": str(runtime.settings.limits.retry_after_s)},
        ) from None
    return Response(answer.content, media_type=CONTENT_TYPE_LATEST)


def router() -> Router:
    """The metrics routes behind the ``scraper`` guard."""
    return Router("/", route_handlers=[metrics, sidecar_metrics], guards=[scraper])


def metrics_app(
    runtime: Runtime,
    handler: Callable[[Request[Any, Any, Any], Exception], Response[Any]],
) -> Litestar:
    """The metrics alone, for the port of their own (the API app's runtime, no lifespan)."""
    return Litestar(
        route_handlers=[router()],
        dependencies={
            "runtime": Provide(lambda: runtime, use_cache=True, sync_to_thread=False),
        },
        exception_handlers={Exception: handler},
        state=State({"runtime": runtime}),
        openapi_config=None,
        logging_config=None,
    )
