"""The composition root: ``create_app`` wires settings, services, routes and error handling."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Request, Response
from litestar.di import Provide
from litestar.exceptions import HTTPException

from adapters.contract import Backend
from gateway.errors import ClientDisconnected, from_http_exception, to_api_error
from gateway.generation import GenerationService
from gateway.lifecycle import BackendFactory, Runtime, triton_backend
from gateway.metrics import GatewayMetrics
from gateway.routes import chat, completions, health, models
from gateway.settings import Settings

logger = logging.getLogger(__name__)
CLIENT_CLOSED_REQUEST = 499


def _error_handler(
    retry_after_s: int,
) -> Callable[[Request[Any, Any, Any], Exception], Response[Any]]:
    def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        if isinstance(exc, ClientDisconnected):
            logger.info(
                "%s %s: client disconnected; request cancelled", request.method, request.url.path
            )
            return Response(b"", status_code=CLIENT_CLOSED_REQUEST)
        if isinstance(exc, HTTPException):
            error = from_http_exception(exc, request.method, request.url.path)
        else:
            error = to_api_error(exc, retry_after_s=retry_after_s)
        return Response(error.envelope(), status_code=error.status_code, headers=error.headers)

    return handle


def create_app(
    settings: Settings,
    *,
    backend: Backend | None = None,
    backend_factory: BackendFactory = triton_backend,
) -> Litestar:
    """The gateway as an ASGI app; ``backend`` replaces the Triton backend the app would create.

    Start-up (the ASGI lifespan) starts the configured sidecars, loads every model's tokenizer
    and creates the backend; shutdown turns readiness off, drains requests and stops sidecars.
    """
    metrics = GatewayMetrics()
    runtime = Runtime(settings, backend=backend, backend_factory=backend_factory, metrics=metrics)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    def generation() -> GenerationService:
        return runtime.generation

    handler = _error_handler(settings.limits.retry_after_s)
    lifecycle = runtime.lifecycle
    return Litestar(
        route_handlers=[
            chat.create_chat_completion,
            completions.create_completion,
            models.list_models,
            models.retrieve_model,
            health.live,
            health.ready,
            health.metrics,
        ],
        dependencies={
            "settings": Provide(lambda: settings, use_cache=True, sync_to_thread=False),
            "runtime": Provide(lambda: runtime, use_cache=True, sync_to_thread=False),
            "registry": Provide(lambda: runtime.registry, use_cache=True, sync_to_thread=False),
            "generation": Provide(generation, sync_to_thread=False),
        },
        exception_handlers={Exception: handler},
        middleware=[metrics.middleware(lifecycle.request_started, lifecycle.request_finished)],
        lifespan=[lifespan],
        request_max_body_size=settings.limits.max_body_bytes,
        openapi_config=None,
        logging_config=None,
    )
