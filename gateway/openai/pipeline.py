"""The one completion pipeline both endpoints run: authenticate, decode, bound, plan, admit, load
the images, generate, shape, settle.

An endpoint is the data that differs (its body schema, planner and shapers); everything else is
one code path. Every error the pipeline raises carries the caller's rate-limit headers, as
OpenAI's answers do, whatever failed.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import msgspec
from litestar import asgi
from litestar.exceptions import HTTPException
from litestar.handlers import ASGIRouteHandler
from litestar.types import ASGIApp, HTTPScope, Receive, Scope, Send

from gateway.catalog.registry import ModelRegistry, ServedModel
from gateway.core.events import ChoiceResult, Event, UsageMeter, fold
from gateway.core.generation import GenerationService
from gateway.core.plan import Plan
from gateway.errors import (
    ClientDisconnected,
    InvalidRequestError,
    OversizeError,
    to_api_error,
)
from gateway.http.answers import (
    JsonAnswer,
    decode_body,
    read_body,
    stream_response,
    until_disconnect,
)
from gateway.observability import Observability
from gateway.openai.bounds import Bounds
from gateway.openai.protocol import SamplingFields
from gateway.openai.shaping import Header
from gateway.queueing.flows import current_flow
from gateway.queueing.scheduler import Flow
from gateway.tenancy import TenantPolicy
from gateway.tenancy.service import Tenancy, credentials_headers

Body = TypeVar("Body", bound=SamplingFields)
BodyIn = TypeVar("BodyIn", bound=SamplingFields, contravariant=True)
Chunks = Callable[[Plan, AsyncGenerator[Event, None], Header], AsyncGenerator[Any, None]]
Whole = Callable[[Plan, list[ChoiceResult], Header], msgspec.Struct]


class Planner(Protocol[BodyIn]):
    """``plan_chat`` or ``plan_completion``: a request body made into a plan for one caller."""

    def __call__(
        self, model: ServedModel, request: BodyIn, /, *, max_tokens_cap: int | None
    ) -> Coroutine[Any, Any, Plan]: ...


@dataclass(frozen=True)
class Endpoint(Generic[Body]):
    """What one completion endpoint brings to the pipeline."""

    operation: str
    """The GenAI operation name the request is observed under (``chat``, ``text_completion``)."""
    schema: type[Body]
    bounds: Callable[[Body, Bounds], None]
    """Refuses a body over the caller's bounds before anything of it is planned."""
    planner: Planner[Body]
    id_prefix: str
    """Of the answer's id: ``chatcmpl``, ``cmpl``."""
    chunks: Chunks
    whole: Whole
    bind: Callable[[Tenancy, TenantPolicy, Body], Awaitable[Endpoint[Body]]] | None = None
    """For an answer that depends on what its caller stored (a conversation it continues):
    the endpoint bound to the caller and its body, before anything of it is bounded."""
    keep: Callable[[msgspec.Struct], Awaitable[None]] | None = None
    """Runs on a whole answer before it is sent (keeps it where the caller asked)."""


class CompletionPipeline:
    """Runs a completion request from its HTTP body to its answer: SSE or one JSON body."""

    def __init__(
        self,
        generation: GenerationService,
        tenancy: Tenancy,
        registry: ModelRegistry,
        observability: Observability,
        *,
        retry_after_s: int,
        max_body_bytes: int,
    ) -> None:
        self.generation = generation
        self.tenancy = tenancy
        self.registry = registry
        self.observability = observability
        self.retry_after_s = retry_after_s
        self.max_body_bytes = max_body_bytes

    def caller(self, headers: Mapping[str, str]) -> TenantPolicy:
        """The tenant whose key the request's ``headers`` carry."""
        with self.observability.step("gateway.auth"):
            return self.tenancy.authenticate(headers)

    async def answer(self, scope: Scope, receive: Receive, endpoint: Endpoint[Body]) -> ASGIApp:
        """The answer to the request of ``scope``; a failure is raised as the client's error
        with the caller's rate-limit headers."""
        headers: dict[str, str] = {}
        try:
            return await self._answer(scope, receive, endpoint, headers)
        except (ClientDisconnected, HTTPException):
            raise
        except Exception as exc:
            error = to_api_error(exc, retry_after_s=self.retry_after_s)
            error.headers = {**headers, **error.headers}
            raise error from exc

    async def _answer(
        self, scope: Scope, receive: Receive, endpoint: Endpoint[Body], headers: dict[str, str]
    ) -> ASGIApp:
        tenant = self.caller(credentials_headers(scope["headers"]))
        headers.update(self.tenancy.known_headers(tenant))
        self.tenancy.refuse_if_spent(tenant)
        body = decode_body(await read_body(scope, receive, self.max_body_bytes), endpoint.schema)
        model = self.registry.get(body.model, tenant)
        if endpoint.bind is not None:
            endpoint = await until_disconnect(receive, endpoint.bind(self.tenancy, tenant, body))
        try:
            route = model.route
            endpoint.bounds(body, Bounds.of(route.bounds, route.max_n, tenant.max_choices))
            current_flow.set(_flow(tenant, body))
            plan = await self._plan(receive, tenant, model, endpoint, body)
            with self.observability.step("gateway.rate_limit"):
                # A shared store answers while the Triton request is built: it is sent admitted,
                # or for a tenant far from its limits on its way meanwhile
                # (``Admission.expected``).
                admission = await self.tenancy.admission(tenant, plan, headers)
        except OversizeError:
            # Refused for its size, the request still costs the tenant one of its requests:
            # once they are spent, the refusals are 429s.
            await self.tenancy.count_refused(tenant, headers)
            raise
        meter = UsageMeter()
        header = Header.new(endpoint.id_prefix, model.name)

        async def settle() -> None:
            await admission.settle(meter.total())

        try:
            # Images are fetched and decoded only for an admitted request; the plan counted them.
            if plan.images is not None:
                await admission.admitted()
                with self.observability.step("gateway.images"):
                    plan = await until_disconnect(receive, plan.with_images())
            events = self.generation.events(
                model,
                plan,
                meter,
                priority=tenant.priority,
                cache_salt=self.tenancy.cache_salt(
                    tenant, shared=model.route.shared_kv_cache, client=body.cache_salt or None
                ),
                admission=admission,
            )
            if plan.stream:
                # Once the stream is answered, it settles the ticket when it ends, however.
                return await stream_response(
                    receive,
                    endpoint.chunks(plan, events, header),
                    retry_after_s=self.retry_after_s,
                    headers=headers,
                    on_close=settle,
                )
            results = await until_disconnect(receive, fold(plan, events))
            await settle()
            answer = endpoint.whole(plan, results, header)
            if endpoint.keep is not None:
                await endpoint.keep(answer)
            return JsonAnswer(answer, headers)
        except BaseException:
            # Settles what was not: the events never started, failed or were cut off.
            await settle()
            raise

    async def _plan(
        self,
        receive: Receive,
        tenant: TenantPolicy,
        model: ServedModel,
        endpoint: Endpoint[Body],
        body: Body,
    ) -> Plan:
        """Template and count the request within the tenant's ``max_tokens`` (cancelled if the
        client leaves), observed under the adapter's own name however the client named it."""
        base = model.base or model.name
        adapter = model.adapter.name if model.adapter is not None else None
        self.observability.serving(base, adapter, tenant.name, endpoint.operation)
        planning = endpoint.planner(model, body, max_tokens_cap=tenant.max_tokens)
        with self.observability.step("gateway.template"):
            return await until_disconnect(receive, planning)


def _flow(tenant: TenantPolicy, body: SamplingFields) -> Flow:
    """The flow the request waits in when its model is full."""
    priority = body.priority if isinstance(body.priority, int) else None
    tier = body.service_tier if isinstance(body.service_tier, str) else None
    return Flow(
        tenant.name,
        weight=tenant.weight,
        priority_class=request_class(tenant.priority_class, priority, tier),
        max_queued=tenant.max_queued,
    )


def request_class(tenant_class: int, priority: int | None, service_tier: str | None) -> int:
    """The class a request is queued in: its tenant's, lowered (never raised) by the request's
    ``priority`` (a class, higher first, as llm-d's ``InferenceObjective``) or by OpenAI's
    ``service_tier: flex`` (one class below the tenant's)."""
    level = tenant_class
    if service_tier == "flex":
        level -= 1
    if priority is not None:
        if priority > tenant_class:
            raise InvalidRequestError(
                f"priority {priority} is above your class ({tenant_class}); a request may "
                "lower its priority, not raise it.",
                param="priority",
            )
        level = min(level, priority)
    return level


def route(path: str, endpoint: Endpoint[Any]) -> ASGIRouteHandler:
    """``POST path`` answered by ``endpoint``: a plain ASGI handler inside the app's middleware
    and error handling, without the framework's per-request parsing of parameters and
    injection of dependencies (the pipeline is read from the app's runtime). The routers' gate
    (``gateway.runtime.lifecycle.gate``) answers its other methods and refuses it while draining."""

    async def handle(scope: HTTPScope, receive: Receive, send: Send) -> None:
        pipeline: CompletionPipeline | None = scope["litestar_app"].state.runtime.pipeline
        if pipeline is None:
            raise RuntimeError("the gateway has not started")
        answer = await pipeline.answer(scope, receive, endpoint)
        await answer(scope, receive, send)

    return asgi(path, copy_scope=False, opt={"methods": ("OPTIONS", "POST")})(handle)
