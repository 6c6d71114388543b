"""The gateway's runtime: the services the app serves with (tokenizers, adapters, the backend,
tenancy, the generation service and the completion pipeline), built once at start and closed at
shutdown, with its ``Lifecycle``. Where the sidecars come from is a mode of its own
(``gateway.runtime.modes``)."""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, runtime_checkable

import httpx

from adapters.contract import Backend, ModelTarget
from deploy.sidecar.spec import Spec
from deploy.sidecar.supervisor import Sidecar
from gateway.catalog.lora import AdapterError, AdapterExists
from gateway.catalog.lora.board import AdapterBoard
from gateway.catalog.registry import (
    ModelRegistry,
    ModelRoute,
    load_model,
    resolve_routes,
    triton_endpoints,
)
from gateway.catalog.transports import choose_transports, log_choices
from gateway.core.generation import GenerationService
from gateway.observability import Observability
from gateway.openai.pipeline import CompletionPipeline
from gateway.queueing.metrics import QueueMetrics
from gateway.queueing.shared import shared_ledgers
from gateway.replicas.metrics import ReplicaMetrics
from gateway.replicas.router import Router
from gateway.replicas.sources import ReplicaAddress, Resolver, resolve_addresses
from gateway.runtime.lifecycle import Lifecycle
from gateway.runtime.shared import SidecarView
from gateway.runtime.spec import read_spec, resolve_spec
from gateway.settings import Settings, SettingsError, check_settings
from gateway.tenancy.service import Tenancy

logger = logging.getLogger(__name__)
CLOSE_S = 5.0
"""How long one part of the runtime may take to close at shutdown before the rest goes on."""
BACKEND_CLOSE_S = 15.0
"""The backend's bound: it first finishes the stop requests of abandoned calls."""
BackendFactory = Callable[[tuple[ModelRoute, ...]], Backend]
SidecarAddresses = tuple[dict[str, str], dict[str, str], dict[str, list[ReplicaAddress]]]
"""Per pipeline: the gRPC and HTTP addresses of its (first) sidecar, and where several sidecars
host it, every one as a replica."""


def triton_backend(routes: tuple[ModelRoute, ...], *, keep_alive_s: float) -> Backend:
    """The production backend: Triton over gRPC or HTTP, its HTTP connections kept alive for
    ``keep_alive_s`` (0: one per request); with replicas, channels that reconnect to a
    restarted replica within a couple of seconds."""
    from adapters.triton.client import TritonBackend

    replicated = any(route.replicas is not None for route in routes)
    backoff_s = 2.0 if replicated else None
    return TritonBackend(max_reconnect_backoff_s=backoff_s, http_keep_alive_s=keep_alive_s)


@runtime_checkable
class DescribesModels(Protocol):
    """A backend that can read a model's Triton config ahead of the first request."""

    async def describe(self, target: ModelTarget) -> object:
        """The target's inputs and options as discovered from Triton."""
        ...


class Runtime(abc.ABC):
    """Owns the services the app serves with; a mode (``gateway.runtime.modes``) says where the
    sidecars come from: supervised here, or by the parent of this worker."""

    def __init__(
        self,
        settings: Settings,
        *,
        backend: Backend | None,
        backend_factory: BackendFactory,
        observability: Observability,
        spec: Spec | None = None,
        resolver: Resolver = resolve_addresses,
    ) -> None:
        check_settings(settings)
        self.settings = settings
        self.registry = ModelRegistry()
        self.lifecycle = Lifecycle(settings.limits.retry_after_s)
        self.observability = observability
        self.metrics = observability.metrics
        self.tenancy = Tenancy(settings.tenancy, self.metrics)
        store = settings.tenancy.store
        self.adapter_board = AdapterBoard(
            self.registry,
            self.tenancy.redis,
            prefix=store.prefix,
            refresh_s=store.refresh_s,
            timeout_s=store.timeout_s,
        )
        """Adapters loaded at run time, shared by every process that shares the Redis store."""
        self._spec = spec
        """The deploy spec as ``serve`` read it (its built-in model names are resolved at
        start); read at start when not given."""
        self._backend = backend
        self._owns_backend = backend is None
        self._backend_factory = backend_factory
        self._executor = ThreadPoolExecutor(
            settings.limits.tokenizer_threads, thread_name_prefix="tokenizer"
        )
        self._generation: GenerationService | None = None
        self.pipeline: CompletionPipeline | None = None
        """The completion pipeline both completion routes run, once started: a plain attribute,
        as the routes read it on every request."""
        self.metrics.watch_sidecars(lambda: self.sidecars)
        self._resolver = resolver
        self.router = Router(())
        """The replica pools of models served by several Tritons."""
        self.metrics.registry.register(ReplicaMetrics(lambda: self.router, lambda: self._backend))
        self.metrics.registry.register(QueueMetrics(lambda: self.router.all_slots()))
        self._bring_up_task: asyncio.Task[None] | None = None
        self.http = httpx.AsyncClient()
        """One HTTP client for what the gateway fetches itself (its sidecars' metrics)."""
        self._hurried = False

    @property
    @abc.abstractmethod
    def sidecars(self) -> Sequence[Sidecar] | Sequence[SidecarView]:
        """The sidecars the models run in; none when the gateway uses existing Tritons."""

    @property
    @abc.abstractmethod
    def supervised(self) -> bool:
        """Whether the models run in sidecars that start with the gateway (readiness waits)."""

    @abc.abstractmethod
    async def _prepare_sidecars(self, spec: Spec) -> SidecarAddresses:
        """The sidecars built (not started) and their addresses by pipeline."""

    @abc.abstractmethod
    async def _sidecars_up(self) -> bool:
        """Wait until the sidecars take requests; ``False`` when they never will."""

    @abc.abstractmethod
    def _stop_sidecars(self) -> None:
        """Stop what this process started of the sidecars."""

    @property
    def backend(self) -> Backend:
        """The backend, once started."""
        if self._backend is None:
            raise RuntimeError("the gateway has not started")
        return self._backend

    @property
    def generation(self) -> GenerationService:
        """The generation service, once started."""
        if self._generation is None:
            raise RuntimeError("the gateway has not started")
        return self._generation

    async def start(self) -> None:
        """Prepare sidecars, load every tokenizer, create the backend; sidecars boot meanwhile."""
        try:
            await self._start()
        except BaseException:
            await self.tenancy.close()
            await asyncio.to_thread(self._stop_sidecars)
            raise

    async def _start(self) -> None:
        await self.tenancy.start()
        spec, grpc_urls, http_urls, hosts = await self._addresses()
        kept = {sidecar.name for sidecar in self.sidecars if sidecar.keeps_responses}
        choices = choose_transports(self.settings, spec, kept)
        over_http = {choice.model for choice in choices if choice.transport == "http"}
        routes = resolve_routes(self.settings, spec, grpc_urls, http_urls, hosts, over_http)
        log_choices(choices)
        by_name = {route.name: route for route in routes}
        self.metrics.record_transports(
            (choice.model, endpoint, choice.transport, choice.reason)
            for choice in choices
            for endpoint in triton_endpoints(by_name[choice.model])
        )
        # One thread, one model after another: transformers' lazy imports are not thread-safe.
        models = await asyncio.to_thread(
            lambda: [load_model(route, self._executor) for route in routes]
        )
        self.registry.replace(models)
        await self._load_adapters(routes)
        await self.adapter_board.start()
        if self._backend is None:
            self._backend = self._backend_factory(routes)
        retry_after_s = self.settings.limits.retry_after_s
        queueing = self.settings.queueing
        link = self.tenancy.redis
        self.router = Router(
            routes,
            retry_after_s=retry_after_s,
            resolver=self._resolver,
            queueing=queueing,
            ledgers=shared_ledgers(link, self.settings.tenancy.store.prefix, queueing.half_life_s)
            if link is not None and queueing.shared
            else None,
        )
        self.router.share_queues()
        if not self.supervised:
            self.router.start(self._backend, self.http)
        self._generation = GenerationService(
            self._backend,
            timeout_s=self.settings.limits.request_timeout_s,
            observability=self.observability,
            # Models without a pool, slots or llm-d headers go straight to their Triton.
            dispatcher=self.router if self.router.dispatches else None,
        )
        self.pipeline = CompletionPipeline(
            self._generation,
            self.tenancy,
            self.registry,
            self.observability,
            retry_after_s=retry_after_s,
            max_body_bytes=self.settings.limits.max_body_bytes,
        )
        self.lifecycle.sidecars_ready = not self.supervised
        self._bring_up_task = asyncio.create_task(self._bring_up(routes))
        self.lifecycle.started = True
        logger.info("gateway started with %d model(s)", len(self.registry))

    async def _addresses(self) -> tuple[Spec | None, *SidecarAddresses]:
        """The deploy spec and the addresses of its pipelines; none without sidecars."""
        sidecars = self.settings.sidecars
        if sidecars is None:
            return None, {}, {}, {}
        given = self._spec
        if given is None:
            spec = await asyncio.to_thread(read_spec, sidecars)
        else:
            spec = await asyncio.to_thread(resolve_spec, given)
        return spec, *await self._prepare_sidecars(spec)

    async def _load_adapters(self, routes: tuple[ModelRoute, ...]) -> None:
        """Load the adapters the settings name; a bad one stops the start with its reason."""
        by_name = {route.name: route for route in routes}
        for model in self.settings.models:
            route = by_name[model.name]
            for adapter in model.adapters:
                try:
                    await self.registry.adapters.load(
                        adapter.name, adapter.path, route.name, route.tokenizer_dir
                    )
                except (AdapterError, AdapterExists) as exc:
                    raise SettingsError(f"model {model.name!r}: {exc}") from exc

    async def stop(self) -> None:
        """Readiness off, drain in-flight requests, close the backend, stop the sidecars."""
        self.lifecycle.stopping = True
        grace = 0.0 if self._hurried else self.settings.limits.shutdown_grace_s
        if not await self.lifecycle.drained(grace):
            logger.warning("requests still in flight after %.0f s; shutting down anyway", grace)
        await _bounded("the replica router", self.router.close())
        if self._backend is not None and self._owns_backend:
            await _bounded("the backend", self._backend.close(), BACKEND_CLOSE_S)
        await _bounded("the adapter board", self.adapter_board.close())
        await _bounded("tenancy", self.tenancy.close())
        if self._bring_up_task is not None:
            self._bring_up_task.cancel()
        await asyncio.to_thread(self._stop_sidecars)
        await _bounded("the HTTP client", self.http.aclose())
        self._executor.shutdown(wait=False, cancel_futures=True)
        await _bounded("observability", asyncio.to_thread(self.observability.close))

    async def _bring_up(self, routes: tuple[ModelRoute, ...]) -> None:
        """Wait for the sidecars, then read each model's Triton config so the first request is
        fast."""
        if not await self._sidecars_up():
            return
        self.lifecycle.sidecars_ready = True
        backend = self._backend
        if self.supervised and backend is not None:
            # Only once they are up: a gRPC call in flight while a sidecar is forked can crash
            # the child, and a probe of one still starting would eject it.
            self.router.start(backend, self.http)
        if not isinstance(backend, DescribesModels):
            return
        for route in routes:
            if route.replicas is not None:
                continue  # each replica's config is read with its first request
            try:
                described = await backend.describe(route.target)
            except Exception as exc:
                logger.warning(
                    "could not read the config of %s: %s", route.target.triton_model, exc
                )
                continue
            logger.info("read the Triton config of %s", route.target.triton_model)
            logger.debug("%s: %r", route.target.triton_model, described)
            self._warn_if_unscoped(route, described)

    def _warn_if_unscoped(self, route: ModelRoute, described: object) -> None:
        """Say at start, not at a tenant's first request, that a model will refuse scoped
        requests: its engine reuses cached prompts and its config takes no ``cache_salt_id``."""
        unsalted = getattr(described, "reuses_kv_cache", False) and not getattr(
            described, "salts_kv_cache", True
        )
        if unsalted and self.tenancy.settings.auth and not route.shared_kv_cache:
            logger.warning(
                "model %s reuses cached prompts but its config declares no cache_salt_id: "
                "requests of tenants are refused (set shared_kv_cache on it to let them share "
                "its cache, or turn enable_kv_cache_reuse off)",
                route.name,
            )

    def hurry(self) -> None:
        """Stop without waiting for requests (a second signal); sidecars get a short grace."""
        self._hurried = True


def sidecar_addresses(
    spec: Spec, sidecars: Sequence[Sidecar] | Sequence[SidecarView]
) -> SidecarAddresses:
    """The addresses of each pipeline, from the sidecars hosting it."""
    by_name = {sidecar.name: sidecar for sidecar in sidecars}
    grpc_urls: dict[str, str] = {}
    http_urls: dict[str, str] = {}
    hosts: dict[str, list[ReplicaAddress]] = {}
    for sidecar_spec in spec.sidecars:
        sidecar = by_name.get(sidecar_spec.name)
        if sidecar is None:
            raise SettingsError(f"sidecar {sidecar_spec.name!r} is not among the shared ones")
        endpoint = ReplicaAddress(
            sidecar.name, sidecar.grpc_url, sidecar.metrics_url, sidecar.http_url
        )
        for model in spec.models_of(sidecar_spec):
            grpc_urls.setdefault(model.name, sidecar.grpc_url)
            http_urls.setdefault(model.name, sidecar.http_url)
            hosts.setdefault(model.name, []).append(endpoint)
    replicas = {name: found for name, found in hosts.items() if len(found) > 1}
    return grpc_urls, http_urls, replicas


async def _bounded(part: str, closing: Awaitable[None], timeout_s: float = CLOSE_S) -> None:
    """Close one part of the runtime, giving up after ``timeout_s`` (named in the log): a
    shutdown never hangs on one part, and a stuck one is known."""
    try:
        await asyncio.wait_for(closing, timeout_s)
    except TimeoutError:
        logger.warning("closing %s took more than %g s; shutting down anyway", part, timeout_s)
