"""The composition root: ``create_app`` builds the app, its routers and its error handling around
one ``Runtime``, which holds every service behind the routes (built once when the app starts);
the app's state holds that runtime and nothing else."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litestar import Litestar, Request, Response, Router
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException
from opentelemetry.sdk.trace.export import SpanExporter

from adapters.contract import Backend
from deploy.sidecar.spec import Spec
from gateway.app.docs import docs, docs_asset, openapi_json
from gateway.catalog.lora.board import AdapterBoard
from gateway.catalog.registry import ModelRegistry
from gateway.errors import ClientDisconnected, from_http_exception, to_api_error
from gateway.observability import Observability
from gateway.openai.chat import routes as chat
from gateway.openai.completions import routes as completions
from gateway.openai.models import lora as lora_admin
from gateway.openai.models import routes as models
from gateway.openai.responses import routes as responses
from gateway.ops import health, metrics
from gateway.replicas.sources import Resolver, resolve_addresses
from gateway.runtime.base import BackendFactory, Runtime, triton_backend
from gateway.runtime.lifecycle import gate
from gateway.runtime.modes import SupervisingRuntime, WorkerRuntime
from gateway.server import SideListener, door_limits
from gateway.settings import Settings, SettingsError
from gateway.tenancy import routes as tenancy_admin
from gateway.tenancy.service import Tenancy

logger = logging.getLogger(__name__)
CLIENT_CLOSED_REQUEST = 499


@dataclass(frozen=True)
class WorkerContext:
    """What a worker process learns from its parent."""

    index: int
    shared_sidecars: Path | None
    """The parent's sidecar state file; ``None`` when the models' Tritons run elsewhere."""


Handler = Callable[[Request[Any, Any, Any], Exception], Response[Any]]


def error_handler(retry_after_s: int) -> Handler:
    """The one exception handler: every failure as OpenAI's error object, its headers kept."""

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


def _runtime(state: State) -> Runtime:
    return state.runtime  # type: ignore[no-any-return]


def _registry(state: State) -> ModelRegistry:
    return state.runtime.registry  # type: ignore[no-any-return]


def _tenancy(state: State) -> Tenancy:
    return state.runtime.tenancy  # type: ignore[no-any-return]


def _board(state: State) -> AdapterBoard:
    return state.runtime.adapter_board  # type: ignore[no-any-return]


def dependencies() -> dict[str, Provide]:
    """Services for handlers, read from the app's state (built once at start). Fresh per app:
    a cached ``Provide`` keeps the first value it gave."""
    return {
        "runtime": Provide(_runtime, use_cache=True, sync_to_thread=False),
        "registry": Provide(_registry, use_cache=True, sync_to_thread=False),
        "tenancy": Provide(_tenancy, use_cache=True, sync_to_thread=False),
        "board": Provide(_board, use_cache=True, sync_to_thread=False),
        "audience": Provide(models.audience, sync_to_thread=False),
    }


def routers(*, metrics_on_api_port: bool) -> list[Router | Any]:
    """The API (completions, models), the admin API behind the admin key, and operations."""
    api = Router(
        "/",
        route_handlers=[
            chat.create_chat_completion,
            completions.create_completion,
            models.list_models,
            models.retrieve_model,
            *responses.ROUTES,
        ],
        middleware=[gate],
    )
    admin = Router(
        "/",
        route_handlers=[*tenancy_admin.ROUTES, *lora_admin.ROUTES],
        guards=[tenancy_admin.admin_only],
        middleware=[gate],
    )
    ops = [health.live, health.ready, openapi_json, docs, docs_asset]
    return [api, admin, *ops, *([metrics.router()] if metrics_on_api_port else [])]


def create_app(
    settings: Settings,
    *,
    backend: Backend | None = None,
    backend_factory: BackendFactory | None = None,
    span_exporter: SpanExporter | None = None,
    worker: WorkerContext | None = None,
    resolver: Resolver = resolve_addresses,
    spec: Spec | None = None,
) -> Litestar:
    """The gateway as an ASGI app; ``backend`` replaces the Triton backend the app would create.

    Start-up (the ASGI lifespan) starts the configured sidecars, loads every model's tokenizer,
    creates the backend and the completion pipeline; shutdown turns readiness off, drains
    requests and stops sidecars. ``span_exporter`` receives the spans (tests pass an in-memory
    one). ``worker`` makes the app one of several worker processes: the sidecars its parent
    supervises are used, not started, and the ports are shared. ``resolver`` looks up the
    addresses of ``dns:`` replicas (tests pass their own). ``spec`` is the deploy spec as
    ``serve`` read it (read at start when not given).
    """
    observability = Observability(settings.observability, span_exporter=span_exporter)
    services: dict[str, Any] = {
        "backend": backend,
        "backend_factory": backend_factory
        or functools.partial(triton_backend, keep_alive_s=settings.limits.triton_keep_alive_s),
        "observability": observability,
        "spec": spec,
        "resolver": resolver,
    }
    runtime: Runtime
    if worker is not None and worker.shared_sidecars is not None:
        runtime = WorkerRuntime(settings, shared_sidecars=worker.shared_sidecars, **services)
    else:
        runtime = SupervisingRuntime(settings, **services)
    handler = error_handler(settings.limits.retry_after_s)
    beside = None
    if settings.observability.metrics.port is not None:
        beside = SideListener(
            metrics.metrics_app(runtime, handler),
            settings.observability.metrics.host or settings.server.host,
            settings.observability.metrics.port,
            "observability.metrics.port",
            shared=worker is not None,
            keep_alive_s=settings.server.keep_alive_s,
            door=door_limits(settings),
        )

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
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

    lifecycle = runtime.lifecycle
    return Litestar(
        route_handlers=routers(metrics_on_api_port=beside is None),
        dependencies=dependencies(),
        exception_handlers={Exception: handler},
        middleware=[
            observability.middleware(lifecycle.request_started, lifecycle.request_finished)
        ],
        lifespan=[lifespan],
        state=State({"runtime": runtime}),
        request_max_body_size=settings.limits.max_body_bytes,
        openapi_config=None,
        logging_config=None,
    )
