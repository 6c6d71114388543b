"""The shared last step of both completion routes: admit, stream or collect, settle."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import msgspec
from litestar import Request
from litestar.types import ASGIApp

from gateway.generation import ChoiceResult, Event, GenerationService, UsageMeter, fold
from gateway.observability import Observability
from gateway.registry import ModelRegistry, ServedModel
from gateway.responses import Header
from gateway.tenancy import TenantPolicy
from gateway.tenancy.service import Tenancy
from gateway.translate import Plan
from gateway.transport import JsonAnswer, stream_response, until_disconnect

Body = TypeVar("Body", contravariant=True)
Chunks = Callable[[Plan, AsyncGenerator[Event, None], Header], AsyncGenerator[Any, None]]
Whole = Callable[[Plan, list[ChoiceResult], Header], msgspec.Struct]
RATE_LIMIT_HEADERS = "rate_limit_headers"
"""Key of ``request.state`` holding the headers every answer to the request carries."""


class Planner(Protocol[Body]):
    """``plan_chat`` or ``plan_completion``: a request body made into a plan for one caller."""

    def __call__(
        self, model: ServedModel, request: Body, /, *, max_tokens_cap: int | None
    ) -> Coroutine[Any, Any, Plan]: ...


class Answers:
    """Turns an admitted plan into the HTTP answer: server-sent events or one JSON body."""

    def __init__(
        self,
        generation: GenerationService,
        tenancy: Tenancy,
        registry: ModelRegistry,
        observability: Observability,
        *,
        retry_after_s: int,
    ) -> None:
        self.generation = generation
        self.tenancy = tenancy
        self.registry = registry
        self.observability = observability
        self.retry_after_s = retry_after_s

    def caller(self, request: Request[Any, Any, Any]) -> TenantPolicy:
        """The tenant whose key ``request`` carries; its rate-limit headers go on every answer."""
        with self.observability.step("gateway.auth"):
            tenant = self.tenancy.authenticate(request.headers)
        request.state[RATE_LIMIT_HEADERS] = self.tenancy.known_headers(tenant)
        return tenant

    async def plan(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantPolicy,
        model: ServedModel,
        operation: str,
        planner: Planner[Body],
        body: Body,
    ) -> Plan:
        """Template and count the request within the tenant's ``max_tokens`` (cancelled if the
        client leaves), observed under the adapter's own name however the client named it."""
        base = model.base or model.name
        adapter = model.adapter.name if model.adapter is not None else None
        self.observability.serving(base, adapter, tenant.name, operation)
        planning = planner(model, body, max_tokens_cap=tenant.max_tokens)
        with self.observability.step("gateway.template"):
            return await until_disconnect(request.receive, planning)

    async def respond(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantPolicy,
        model: ServedModel,
        plan: Plan,
        header: Header,
        chunks: Chunks,
        whole: Whole,
    ) -> ASGIApp:
        """Reserve the plan against the tenant's limits, run it, and give back what it spared."""
        with self.observability.step("gateway.rate_limit"):
            ticket = await self.tenancy.admit(tenant, plan)
        headers = ticket.headers()
        request.state[RATE_LIMIT_HEADERS] = headers
        meter = UsageMeter()
        events = self.generation.events(model, plan, meter, priority=tenant.priority)

        async def settle() -> None:
            await ticket.settle_shielded(meter.total())

        try:
            if plan.stream:
                # Once the stream is answered, it settles the ticket when it ends, however.
                return await stream_response(
                    request.receive,
                    chunks(plan, events, header),
                    retry_after_s=self.retry_after_s,
                    headers=headers,
                    on_close=settle,
                )
            results = await until_disconnect(request.receive, fold(plan, events))
            await settle()
            return JsonAnswer(whole(plan, results, header), headers)
        except BaseException:
            # Settles what was not: the events never started, failed or were cut off.
            await settle()
            raise
