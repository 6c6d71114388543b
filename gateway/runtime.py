"""The gateway's runtime: what the app starts and stops (sidecars, tokenizers, adapters, the
backend, the generation service), with its ``Lifecycle``."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, runtime_checkable

import httpx

from adapters.contract import Backend, ModelTarget
from deploy.sidecar import frontend
from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import Spec, SpecError, load_spec, parse_spec
from deploy.sidecar.supervisor import Sidecar
from gateway.catalog.lora import AdapterError, AdapterExists
from gateway.catalog.lora.board import AdapterBoard
from gateway.catalog.registry import ModelRegistry, ModelRoute, load_model, resolve_routes
from gateway.core.generation import GenerationService
from gateway.observability import Observability
from gateway.ops.drain import Lifecycle
from gateway.queueing.metrics import QueueMetrics
from gateway.queueing.shared import shared_ledgers
from gateway.replicas.metrics import ReplicaMetrics
from gateway.replicas.router import Router
from gateway.replicas.sources import Endpoint, Resolver, resolve_addresses
from gateway.settings import Settings, SettingsError, SidecarSettings, check_settings
from gateway.tenancy.service import Tenancy
from gateway.workers.shared import SidecarView, read_state

logger = logging.getLogger(__name__)
CLOSE_S = 5.0
"""How long one part of the runtime may take to close at shutdown before the rest goes on."""
BACKEND_CLOSE_S = 15.0
"""The backend's bound: it first finishes the stop requests of abandoned calls."""
BackendFactory = Callable[[tuple[ModelRoute, ...]], Backend]


def triton_backend(routes: tuple[ModelRoute, ...], *, keep_alive_s: float) -> Backend:
    """The production backend: Triton over gRPC or HTTP, its HTTP connections kept alive for
    ``keep_alive_s`` (0: one per request); with replicas, channels that reconnect to a
    restarted replica within a couple of seconds."""
    from adapters.triton.client import TritonBackend

    replicated = any(route.replicas is not None for route in routes)
    backoff_s = 2.0 if replicated else None
    return TritonBackend(max_reconnect_backoff_s=backoff_s, http_keep_alive_s=keep_alive_s)


def read_spec(sidecars: SidecarSettings) -> Spec:
    """The deploy spec of the sidecars, built-in model names resolved (may convert a model)."""
    from deploy.sidecar.models import resolve_aliases

    try:
        if sidecars.spec is not None:
            spec = load_spec(sidecars.spec)
        else:
            spec = parse_spec(sidecars.inline or {})
    except SpecError as exc:
        raise SettingsError(f"deploy spec: {exc}") from exc
    return resolve_aliases(spec)


@runtime_checkable
class DescribesModels(Protocol):
    """A backend that can read a model's Triton config ahead of the first request."""

    async def describe(self, target: ModelTarget) -> object:
        """The target's inputs and options as discovered from Triton."""
        ...


class Runtime:
    """Owns what the app starts: sidecars, tokenizers, the backend and the generation service."""

    def __init__(
        self,
        settings: Settings,
        *,
        backend: Backend | None,
        backend_factory: BackendFactory,
        observability: Observability,
        shared_sidecars: Path | None = None,
        resolver: Resolver = resolve_addresses,
    ) -> None:
        check_settings(settings)
        self.settings = settings
        self.registry = ModelRegistry()
        self.lifecycle = Lifecycle()
        self.observability = observability
        self.metrics = observability.metrics
        self.tenancy = Tenancy(settings.tenancy, self.metrics)
        store = settings.tenancy.store
        self.adapter_board = AdapterBoard(
            self.registry, self.tenancy.redis, prefix=store.prefix, refresh_s=store.refresh_s
        )
        """Adapters loaded at run time, shared by every process that shares the Redis store."""
        self._backend = backend
        self._owns_backend = backend is None
        self._backend_factory = backend_factory
        self._executor = ThreadPoolExecutor(
            settings.limits.tokenizer_threads, thread_name_prefix="tokenizer"
        )
        self._generation: GenerationService | None = None
        self._sidecars: list[Sidecar] = []
        self._shared = shared_sidecars
        """The state file of sidecars another process supervises (a worker's parent)."""
        self.metrics.watch_sidecars(lambda: self.sidecars)
        self._resolver = resolver
        self.router = Router(())
        """The replica pools of models served by several Tritons."""
        self.metrics.registry.register(ReplicaMetrics(lambda: self.router, lambda: self._backend))
        self.metrics.registry.register(QueueMetrics(lambda: self.router.all_slots()))
        self._bring_up_task: asyncio.Task[None] | None = None
        self.http = httpx.AsyncClient()
        """One HTTP client for what the gateway fetches itself (its sidecars' metrics)."""
        self._workdir: Path | None = None
        self._temporary_workdir = False
        self._hurried = False

    @property
    def sidecars(self) -> list[Sidecar] | list[SidecarView]:
        """The sidecars: supervised here, or by the parent of this worker; none when the
        gateway uses existing Tritons."""
        if self._shared is not None:
            return list(read_state(self._shared).sidecars)
        return list(self._sidecars)

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
        spec, grpc_urls, http_urls, hosts = await self._prepare_sidecars()
        sidecar_http = self._sidecars_keep_responses()
        routes = resolve_routes(self.settings, spec, grpc_urls, http_urls, hosts, sidecar_http)
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
        client = self.tenancy.redis
        self.router = Router(
            routes,
            retry_after_s=retry_after_s,
            resolver=self._resolver,
            queueing=queueing,
            ledgers=shared_ledgers(client, self.settings.tenancy.store.prefix, queueing.half_life_s)
            if client is not None and queueing.shared
            else None,
        )
        self.router.share_queues()
        supervised = bool(self._sidecars) or self._shared is not None
        if not supervised:
            self.router.start(self._backend, self.http)
        self._generation = GenerationService(
            self._backend,
            timeout_s=self.settings.limits.request_timeout_s,
            observability=self.observability,
            router=self.router,
        )
        self.lifecycle.sidecars_ready = not supervised
        self._bring_up_task = asyncio.create_task(self._bring_up(routes))
        self.lifecycle.started = True
        logger.info("gateway started with %d model(s)", len(self.registry))

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

    def _sidecars_keep_responses(self) -> bool:
        """Whether the supervised sidecars' HTTP frontends keep every streamed response
        (``deploy.sidecar.frontend``): each runs with the response keeper, or the host's buffer
        is large enough, as this worker's parent read it when it built them, or as it is now,
        just before this process starts them."""
        if self._shared is not None:
            state = read_state(self._shared)
            kept = [sidecar.keeps_responses for sidecar in state.sidecars]
            queue = state.queue_bytes
        else:
            kept = [sidecar.keeps_responses for sidecar in self._sidecars]
            queue = frontend.queue_bytes()
        return frontend.keeps_responses(queue, keeper=bool(kept) and all(kept))

    async def _prepare_sidecars(self) -> tuple[Spec | None, *SidecarAddresses]:
        """The sidecars built (not started), or those of this worker's parent, and their
        addresses by pipeline."""
        sidecars = self.settings.sidecars
        if sidecars is None:
            return None, {}, {}, {}
        spec = await asyncio.to_thread(read_spec, sidecars)
        if self._shared is not None:
            return spec, *shared_urls(spec, read_state(self._shared).sidecars)
        if sidecars.workdir:
            self._workdir = Path(sidecars.workdir)
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="triton-gateway-"))
            self._temporary_workdir = True
        for sidecar_spec in spec.sidecars:
            sidecar = await asyncio.to_thread(sidecar_from_spec, spec, sidecar_spec, self._workdir)
            self._sidecars.append(sidecar)
        return spec, *shared_urls(spec, self._sidecars)

    async def _bring_up(self, routes: tuple[ModelRoute, ...]) -> None:
        """Start the sidecars, then read each model's Triton config so the first request is fast."""
        if self._shared is not None:
            while not read_state(self._shared).ready:
                await asyncio.sleep(0.2)
        for sidecar in self._sidecars:
            try:
                await asyncio.to_thread(sidecar.start)
            except Exception as exc:
                reason = f"sidecar {sidecar.name!r} could not start: {exc}"
                logger.error("%s", reason)
                self.lifecycle.fail(reason)
                return
        self.lifecycle.sidecars_ready = True
        backend = self._backend
        if (self._sidecars or self._shared is not None) and backend is not None:
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

    def _stop_sidecars(self) -> None:
        for sidecar in reversed(self._sidecars):
            sidecar.stop(min(2.0, sidecar.stop_grace_s) if self._hurried else None)
        if self._temporary_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)


SidecarAddresses = tuple[dict[str, str], dict[str, str], dict[str, list[Endpoint]]]
"""Per pipeline: the gRPC and HTTP addresses of its (first) sidecar, and where several sidecars
host it, every one as a replica."""


def shared_urls(
    spec: Spec, sidecars: Sequence[Sidecar] | Sequence[SidecarView]
) -> SidecarAddresses:
    """The addresses of each pipeline, from the sidecars hosting it."""
    by_name = {sidecar.name: sidecar for sidecar in sidecars}
    grpc_urls: dict[str, str] = {}
    http_urls: dict[str, str] = {}
    hosts: dict[str, list[Endpoint]] = {}
    for sidecar_spec in spec.sidecars:
        sidecar = by_name.get(sidecar_spec.name)
        if sidecar is None:
            raise SettingsError(f"sidecar {sidecar_spec.name!r} is not among the shared ones")
        endpoint = Endpoint(sidecar.name, sidecar.grpc_url, sidecar.metrics_url, sidecar.http_url)
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
