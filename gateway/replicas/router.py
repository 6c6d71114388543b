"""Every pool of the app: built from the served models, watched while the app runs, and the
small interface the request path calls (``pool``, ``preparer``); each capped model's slots,
taken there before a request is sent (``gateway.queueing``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import replace
from typing import Protocol

import httpx

from adapters.contract import Backend, GenerationRequest, ModelTarget, PreparedRequest
from gateway.queueing.flows import current_flow, llm_d_headers
from gateway.queueing.gate import ANONYMOUS, ModelSlots
from gateway.queueing.held import HeldRequest
from gateway.queueing.scheduler import Ledger
from gateway.queueing.settings import QueueSettings
from gateway.queueing.shared import SharedLedger
from gateway.replicas import disaggregated, dispatch
from gateway.replicas.disaggregated import PhasePools, SplitObserver
from gateway.replicas.pool import Clock, ReplicaPool
from gateway.replicas.settings import RoutingSettings
from gateway.replicas.sources import ReplicaSource, Resolver, parse_source, resolve_addresses
from gateway.replicas.watch import PoolWatch

logger = logging.getLogger(__name__)


class PooledModel(Protocol):
    """A served model as the router reads it (``ModelRoute``)."""

    @property
    def name(self) -> str: ...

    @property
    def target(self) -> ModelTarget: ...

    @property
    def replicas(self) -> ReplicaSource | None: ...

    @property
    def routing(self) -> RoutingSettings: ...


def _fixed(limit: int) -> Callable[[], int]:
    """A model's slots on its one Triton: its ``max_in_flight``."""
    return lambda: limit


class Router:
    """The replica pools of the models served by several Tritons (none for the others)."""

    def __init__(
        self,
        models: Iterable[PooledModel],
        *,
        retry_after_s: int = 5,
        resolver: Resolver = resolve_addresses,
        clock: Clock | None = None,
        queueing: QueueSettings | None = None,
        ledgers: Callable[[str], Ledger] | None = None,
    ) -> None:
        """``ledgers`` gives each model's ledger of attained service (shared by the gateway's
        processes); by default each model keeps its own."""
        self._pools: dict[str, ReplicaPool] = {}
        self._sources: dict[str, ReplicaSource] = {}
        self._context_pools: dict[str, ReplicaPool] = {}
        """The context pools of disaggregated models, watched as the others are."""
        self._slots: dict[str, ModelSlots] = {}
        self._objectives: dict[str, dict[int, str]] = {}
        self._resolver = resolver
        self._tasks: list[asyncio.Task[None]] = []
        for model in models:
            if model.routing.inference_pool:
                self._objectives[model.name] = dict(model.routing.objectives)
            limit = model.routing.max_in_flight
            settings = queueing or QueueSettings()
            # With the queue off, a pool refuses as it always did, when it picks a replica.
            if limit is not None and (settings.enabled or model.replicas is None):
                self._slots[model.name] = ModelSlots(
                    model.name,
                    _fixed(limit) if model.replicas is None else self._pool_capacity(model.name),
                    settings,
                    retry_after_s=retry_after_s,
                    ledger=ledgers(model.name) if ledgers is not None else None,
                )
            if model.replicas is None:
                continue
            extra = {"clock": clock} if clock is not None else {}
            pool = self._pools[model.name] = ReplicaPool(
                model.name, model.target, model.routing, retry_after_s=retry_after_s, **extra
            )
            self._sources[model.name] = model.replicas
            slots = self._slots.get(model.name)
            if slots is not None:
                pool.on_capacity(slots.pump)
            split = model.routing.disaggregation
            if split is not None:
                context = ReplicaPool(
                    f"{model.name}/context",
                    model.target,
                    model.routing,
                    retry_after_s=retry_after_s,
                    **extra,
                )
                self._context_pools[model.name] = context
                self._sources[context.model] = parse_source(
                    split.context_replicas, model.routing.metrics_port
                )

    def _pool_capacity(self, model: str) -> Callable[[], int]:
        """A pool's slots, read at each use: its replicas come, go and fill up."""
        return lambda: self._pools[model].slots()

    def __iter__(self) -> Iterator[ReplicaPool]:
        return iter([*self._pools.values(), *self._context_pools.values()])

    def __bool__(self) -> bool:
        return bool(self._pools)

    def pool(self, model: str) -> ReplicaPool | None:
        """The pool of the base model ``model``; None when it has one Triton."""
        return self._pools.get(model)

    def slots(self, model: str) -> ModelSlots | None:
        """The slots of the base model ``model``; None when it has no ``max_in_flight``."""
        return self._slots.get(model)

    def all_slots(self) -> Iterator[ModelSlots]:
        """Every model's slots."""
        return iter(self._slots.values())

    def share_queues(self) -> None:
        """Start synchronising the models' shared ledgers, where they have one."""
        for slots in self._slots.values():
            ledger = slots.ledger
            if isinstance(ledger, SharedLedger):
                interval = slots.settings.sync_interval_s
                sync = ledger.run(interval, lambda slots=slots: bool(slots.queue))  # type: ignore[misc]
                self._tasks.append(asyncio.create_task(sync, name=f"fairq-{slots.model}"))

    def start(self, backend: Backend, http: httpx.AsyncClient) -> None:
        """Start probing, scraping and resolving every pool's replicas."""
        for pool in self:
            name = pool.model
            watch = PoolWatch(pool, self._sources[name], backend, http, self._resolver)
            for loop in watch.loops():
                self._tasks.append(asyncio.create_task(loop(), name=f"replicas-{name}"))

    async def close(self) -> None:
        """Stop the background work."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    @property
    def dispatches(self) -> bool:
        """Whether any model's requests go through the router: a pool, slots or llm-d's
        headers (else every request goes straight to its model's one Triton)."""
        return bool(self._pools or self._slots or self._objectives)

    def preparer(
        self,
        model: str,
        backend: Backend,
        target: ModelTarget,
        observer: SplitObserver | None = None,
    ) -> Callable[[GenerationRequest], Awaitable[PreparedRequest]] | None:
        """How requests of the base model ``model`` are prepared: for its pool (their replica
        picked once they are admitted), inside its slots, with llm-d's headers; None where
        they go straight to ``target``, its one Triton."""
        pool = self._pools.get(model)
        slots = self._slots.get(model)
        if pool is None and slots is None and model not in self._objectives:
            return None
        phases = self._phases(model)

        async def prepare(request: GenerationRequest) -> PreparedRequest:
            request = self._tagged(model, request)
            if phases is not None:
                prepared: PreparedRequest = await disaggregated.prepare(
                    phases, backend, observer, request
                )
            elif pool is not None:
                prepared = await dispatch.prepare(pool, backend, observer, request)
            else:
                prepared = await backend.prepare(target, request)
            if slots is None:
                return prepared
            return HeldRequest(slots, current_flow.get() or ANONYMOUS, request, prepared)

        return prepare

    def _phases(self, model: str) -> PhasePools | None:
        """The context and generation pools of a disaggregated model; None for the others."""
        context, pool = self._context_pools.get(model), self._pools.get(model)
        split = None if pool is None else pool.settings.disaggregation
        if context is None or pool is None or split is None:
            return None
        return PhasePools(context, pool, split.min_prompt_tokens)

    def _tagged(self, model: str, request: GenerationRequest) -> GenerationRequest:
        """``request`` with llm-d's fairness and objective headers, where the model is behind
        an ``InferencePool``."""
        objectives = self._objectives.get(model)
        if objectives is None:
            return request
        headers = llm_d_headers(current_flow.get() or ANONYMOUS, objectives)
        return replace(request, trace_headers={**request.trace_headers, **headers})
