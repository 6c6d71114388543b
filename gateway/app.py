"""The composition root: ``create_app`` wires settings, services, routes and error handling."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException
from opentelemetry.sdk.trace.export import SpanExporter

from adapters.contract import Backend
from gateway.errors import (
    ClientDisconnected,
    ServiceUnavailableError,
    from_http_exception,
    to_api_error,
)
from gateway.lifecycle import BackendFactory, Runtime, triton_backend
from gateway.observability import Observability
from gateway.routes import admin, chat, completions, docs, health, lora, metrics, models
from gateway.routes.answer import RATE_LIMIT_HEADERS, Answers
from gateway.routes.models import ADMINISTRATOR, Audience
from gateway.serving import SideListener
from gateway.settings import Settings, SettingsError

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
        headers = {**request.state.get(RATE_LIMIT_HEADERS, {}), **error.headers}
        return Response(error.envelope(), status_code=error.status_code, headers=headers)

    return handle


def create_app(
    settings: Settings,
    *,
    backend: Backend | None = None,
    backend_factory: BackendFactory = triton_backend,
    span_exporter: SpanExporter | None = None,
) -> Litestar:
    """The gateway as an ASGI app; ``backend`` replaces the Triton backend the app would create.

    Start-up (the ASGI lifespan) starts the configured sidecars, loads every model's tokenizer
    and creates the backend; shutdown turns readiness off, drains requests and stops sidecars.
    ``span_exporter`` receives the spans (tests pass an in-memory one).
    """
    observability = Observability(settings.observability, span_exporter=span_exporter)
    runtime = Runtime(
        settings, backend=backend, backend_factory=backend_factory, observability=observability
    )
    handler = _error_handler(settings.limits.retry_after_s)
    metrics_port = settings.observability.metrics.port
    beside = None
    if metrics_port is not None:
        beside = SideListener(
            metrics.metrics_app(runtime, handler),
            settings.observability.metrics.host or settings.server.host,
            metrics_port,
            "observability.metrics.port",
        )

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            try:
                if beside is not None:
                    await beside.start()
                    stack.push_async_callback(beside.stop)
                await runtime.start()
            except SettingsError as exc:
                # A configuration that cannot be served: `serve` exits with the reason (no
                # traceback of a failed ASGI start-up), and the app never becomes ready.
                runtime.lifecycle.fail(str(exc))
            stack.push_async_callback(runtime.stop)
            yield

    answers: Answers | None = None

    def answering() -> Answers:
        nonlocal answers
        if answers is None:
            answers = Answers(
                runtime.generation,
                runtime.tenancy,
                runtime.registry,
                observability,
                retry_after_s=settings.limits.retry_after_s,
            )
        return answers

    def audience(request: Request[Any, Any, Any]) -> Audience:
        if runtime.tenancy.is_admin(request.headers):
            return ADMINISTRATOR
        return Audience(answering().caller(request))

    async def refuse_when_draining(request: Request[Any, Any, Any]) -> None:
        # Async: litestar runs a synchronous hook in a worker thread, on every request.
        if runtime.lifecycle.refusing and request.url.path.startswith(("/v1/", "/admin/")):
            raise ServiceUnavailableError(
                "The gateway is shutting down; retry on another replica.",
                code="shutting_down",
                headers={"Retry-After": str(settings.limits.retry_after_s)},
            )

    def administrator(request: Request[Any, Any, Any]) -> None:
        runtime.tenancy.authenticate_admin(request.headers)

    lifecycle = runtime.lifecycle
    return Litestar(
        route_handlers=[
            chat.create_chat_completion,
            completions.create_completion,
            models.list_models,
            models.retrieve_model,
            health.live,
            health.ready,
            *([] if beside is not None else [metrics.router()]),
            docs.openapi_json,
            docs.docs,
            docs.docs_asset,
            *admin.ROUTES,
            *lora.ROUTES,
        ],
        dependencies={
            "settings": Provide(lambda: settings, use_cache=True, sync_to_thread=False),
            "runtime": Provide(lambda: runtime, use_cache=True, sync_to_thread=False),
            "registry": Provide(lambda: runtime.registry, use_cache=True, sync_to_thread=False),
            "tenancy": Provide(lambda: runtime.tenancy, use_cache=True, sync_to_thread=False),
            "answers": Provide(answering, sync_to_thread=False),
            "audience": Provide(audience, sync_to_thread=False),
            "administrator": Provide(administrator, sync_to_thread=False),
        },
        exception_handlers={Exception: handler},
        middleware=[
            observability.middleware(lifecycle.request_started, lifecycle.request_finished)
        ],
        lifespan=[lifespan],
        before_request=refuse_when_draining,
        state=State({"runtime": runtime}),
        request_max_body_size=settings.limits.max_body_bytes,
        openapi_config=None,
        logging_config=None,
    )
