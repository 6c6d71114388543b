"""Served models: settings resolved against the sidecars' spec, with their tokenizers loaded."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import msgspec

from adapters.contract import LoraAdapter, ModelTarget
from deploy.sidecar.spec import ModelSpec, Spec, TorchEngine
from gateway.catalog.disaggregation import sidecar_pools
from gateway.catalog.lora import LoraLibrary
from gateway.catalog.text.decoding import decoding
from gateway.catalog.text.prompts import PromptTokenizer
from gateway.catalog.transports import choose_transports, served_models
from gateway.catalog.vision import VisionInputs, read_vision
from gateway.core.plan import Prompt
from gateway.errors import unknown_model
from gateway.replicas.settings import RoutingSettings
from gateway.replicas.sources import (
    DnsName,
    ReplicaAddress,
    ReplicaSource,
    SourceError,
    parse_source,
)
from gateway.settings import (
    ImageSettings,
    ModelSettings,
    RequestBounds,
    SamplingDefaults,
    Settings,
    SettingsError,
)
from gateway.tenancy import TenantPolicy
from gateway.tools import ReasoningFormat, ToolFormat, model_formats

logger = logging.getLogger(__name__)
DEFAULT_TRITON_URL = "127.0.0.1:8001"
DEFAULT_CONTEXT_LENGTH = 4096
DEFAULT_ROUTING = RoutingSettings()
DEFAULT_IMAGES = ImageSettings()
DEFAULT_BOUNDS = RequestBounds()


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """A served model with every setting decided, before its tokenizer is loaded."""

    name: str
    target: ModelTarget
    tokenizer_dir: str
    chat_template_file: str | None
    context_length: int | None
    add_special_tokens: bool
    max_n: int
    defaults: SamplingDefaults
    owned_by: str
    tool_call_format: str | None = None
    reasoning_parser: str | None = None
    skip_special_tokens: bool | None = None
    """Whether the gateway's decoding leaves special tokens out; None: all but those the
    model's tool-call and reasoning formats read."""
    postprocessing: str | None = None
    """The pipeline whose postprocessing decodes the text and drops special tokens, where the
    model's Triton model (an ensemble or BLS of a rendered pipeline) is not the engine."""
    replicas: ReplicaSource | None = None
    """The Tritons serving the model when there are several (``target.url`` is then the
    first's, or the DNS name)."""
    routing: RoutingSettings = DEFAULT_ROUTING
    images: ImageSettings = DEFAULT_IMAGES
    counts_prompts: bool = False
    """Whether the gateway's count of a text prompt is the engine's (``count_prompts``)."""
    shared_kv_cache: bool = False
    """Whether every tenant shares the model's cached prompts (``shared_kv_cache``)."""
    bounds: RequestBounds = DEFAULT_BOUNDS
    """The size a request may have, ``max_choices`` decided (the engine's batch by default)."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    """A model ready to serve: where it runs, how to tokenize for it, and its limits."""

    route: ModelRoute
    tokenizer: PromptTokenizer
    context_length: int
    created: int
    tool_format: ToolFormat
    """How the model writes tool calls: its setting's format, else the one its template shows."""
    reasoning: ReasoningFormat | None
    """How the model's reasoning is told from its answer (None: it is all answer)."""
    adapter: LoraAdapter | None = None
    """The LoRA adapter a request named (``route.name`` is then the adapter's name)."""
    base: str | None = None
    """The base model's name when this is an adapter on it."""
    vision: VisionInputs | None = None
    """How the model takes images; None for a text-only model."""

    @property
    def name(self) -> str:
        """Public model id."""
        return self.route.name

    @property
    def target(self) -> ModelTarget:
        """Where the model runs in Triton."""
        return self.route.target

    @property
    def own_counts(self) -> bool:
        """Whether the gateway's count of a text prompt is the engine's, so the engine need not
        be asked: a text model whose preprocessing tokenizes as the gateway does."""
        return self.route.counts_prompts and self.vision is None

    def own_count(self, prompt: Prompt) -> int | None:
        """The prompt's length for ``usage`` where the gateway's count is the engine's
        (``own_counts``), so the engine need not be asked (``None``: ask it)."""
        return prompt.exact_count if self.own_counts else None


def resolve_routes(
    settings: Settings,
    spec: Spec | None,
    grpc_urls: Mapping[str, str],
    http_urls: Mapping[str, str] | None = None,
    sidecar_replicas: Mapping[str, Sequence[ReplicaAddress]] | None = None,
    over_http: Collection[str] | None = None,
) -> tuple[ModelRoute, ...]:
    """Decide every model's Triton address (or replicas), model names and tokenizer (pure).

    ``grpc_urls`` and ``http_urls`` map a pipeline to the addresses of the sidecar hosting it;
    ``sidecar_replicas`` to every sidecar hosting it, for pipelines hosted by several. A target
    has an HTTP address only where its model is named in ``over_http``, the models whose
    transport was decided to be HTTP at start (``gateway.catalog.transports``); by default
    those that the settings alone send over HTTP (no sidecar running the response keeper).
    """
    models = served_models(settings, spec)
    if over_http is None:
        choices = choose_transports(settings, spec, ())
        over_http = {choice.model for choice in choices if choice.transport == "http"}
    routes = tuple(
        _with_replicas(
            _route(model, spec, grpc_urls, http_urls or {}, over_http, settings.limits.bounds),
            model,
            spec,
            sidecar_replicas or {},
            over_http,
        )
        for model in models
    )
    names = [route.name for route in routes]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise SettingsError(f"model names served twice: {duplicates}")
    return routes


def _route(
    model: ModelSettings,
    spec: Spec | None,
    grpc_urls: Mapping[str, str],
    http_urls: Mapping[str, str],
    over_http: Collection[str],
    bounds: RequestBounds,
) -> ModelRoute:
    pipeline = _pipeline(model, spec)
    prefix = f"{model.pipeline}_" if model.pipeline else ""
    triton_model = model.triton_model or f"{prefix}{model.entry}"
    # Without a pipeline the adapter reads the engine from the ensemble's or BLS's own config.
    engine_model = model.engine_model or (
        pipeline.triton_name("tensorrt_llm") if pipeline is not None else None
    )
    url = model.triton_url or (grpc_urls.get(pipeline.name) if pipeline else None)
    http_url = None
    if model.name in over_http:
        http_url = model.triton_http_url
        if http_url is None and model.triton_url is None and pipeline is not None:
            http_url = http_urls.get(pipeline.name)
    tokenizer_dir = model.tokenizer_dir or (pipeline.tokenizer if pipeline else None)
    if tokenizer_dir is None:
        raise SettingsError(f"model {model.name!r}: tokenizer_dir is required without a pipeline")
    context_length = model.context_length
    torch_engine = pipeline.engine if pipeline is not None else None
    if not isinstance(torch_engine, TorchEngine):
        torch_engine = None
    if context_length is None and torch_engine is not None:
        context_length = torch_engine.max_seq_len
    if bounds.max_choices is None and torch_engine is not None:
        # A request of more sequences than the engine batches would hold every row alone.
        bounds = msgspec.structs.replace(bounds, max_choices=torch_engine.max_batch_size)
    add_special = model.add_special_tokens
    if add_special is None:
        add_special = pipeline.add_special_tokens if pipeline is not None else True
    counts_prompts = model.count_prompts
    if counts_prompts is None:
        overridden = (model.triton_url, model.tokenizer_dir, model.add_special_tokens)
        counts_prompts = pipeline is not None and overridden == (None, None, None)
    skip_special = model.skip_special_tokens
    if skip_special is None and pipeline is not None and not pipeline.skip_special_tokens:
        skip_special = False
    postprocessing = None
    if pipeline is not None and model.entry != "tensorrt_llm" and pipeline.skip_special_tokens:
        postprocessing = pipeline.name
    return ModelRoute(
        name=model.name,
        target=ModelTarget(
            url=url or DEFAULT_TRITON_URL,
            triton_model=triton_model,
            kind=model.entry,
            engine_model=engine_model,
            tokens_per_block=model.tokens_per_block,
            http_url=http_url,
        ),
        tokenizer_dir=tokenizer_dir,
        chat_template_file=model.chat_template,
        context_length=context_length,
        add_special_tokens=add_special,
        max_n=model.max_n,
        defaults=model.defaults,
        owned_by=model.owned_by,
        tool_call_format=model.tool_call_format,
        reasoning_parser=model.reasoning_parser,
        skip_special_tokens=skip_special,
        postprocessing=postprocessing,
        images=model.images,
        counts_prompts=counts_prompts,
        shared_kv_cache=model.shared_kv_cache,
        bounds=bounds,
    )


def _with_replicas(
    route: ModelRoute,
    model: ModelSettings,
    spec: Spec | None,
    sidecar_replicas: Mapping[str, Sequence[ReplicaAddress]],
    over_http: Collection[str],
) -> ModelRoute:
    """The route with its replicas: configured ones, or the sidecars hosting its pipeline."""
    source: ReplicaSource | None = None
    routing = model.routing
    takes_http = model.name in over_http
    if model.replicas:
        try:
            source = parse_source(model.replicas, routing.metrics_port, routing.http_port)
        except SourceError as exc:
            raise SettingsError(f"model {model.name!r}: replicas: {exc}") from exc
    elif model.triton_url is None and model.pipeline is not None:
        hosts = sidecar_replicas.get(model.pipeline) or ()
        if hosts or routing.disaggregation is not None:
            found, routing = sidecar_pools(model, spec, hosts, takes_http=takes_http)
            source = found or None
        if source and model.triton_http_url is not None:
            raise SettingsError(
                f"model {model.name!r}: triton_http_url names one Triton, and pipeline "
                f"{model.pipeline!r} runs on several sidecars: leave it to theirs"
            )
    if source is None:
        # One Triton: its ``max_in_flight`` still caps it, with the fair queue in front.
        return dataclasses.replace(route, routing=routing)
    if isinstance(source, DnsName) and not takes_http:
        source = dataclasses.replace(source, http_port=None)
    if isinstance(source, tuple):
        if not takes_http:
            source = tuple(dataclasses.replace(endpoint, http_url=None) for endpoint in source)
        first, http_url = source[0].url, source[0].http_url
    else:
        first, http_url = f"dns:{source.host}:{source.port}", None
    target = dataclasses.replace(route.target, url=first, http_url=http_url)
    return dataclasses.replace(route, target=target, replicas=source, routing=routing)


def triton_endpoints(route: ModelRoute) -> list[str]:
    """The Triton addresses a route's requests stream to: each one's HTTP address where it
    has one, else its gRPC address (a DNS name's, for replicas found by DNS)."""
    replicas = route.replicas
    if isinstance(replicas, DnsName):
        return [f"dns:{replicas.host}:{replicas.port}"]
    if replicas:
        return [endpoint.http_url or endpoint.url for endpoint in replicas]
    return [route.target.http_url or route.target.url]


def _pipeline(model: ModelSettings, spec: Spec | None) -> ModelSpec | None:
    if model.pipeline is None:
        return None
    if spec is None:
        raise SettingsError(
            f"model {model.name!r} names pipeline {model.pipeline!r} but no sidecars"
        )
    for pipeline in spec.models:
        if pipeline.name == model.pipeline:
            return pipeline
    raise SettingsError(
        f"model {model.name!r}: no pipeline {model.pipeline!r} in the sidecars spec"
    )


class ModelRegistry:
    """The served models by public name."""

    def __init__(self, models: list[ServedModel] | None = None) -> None:
        self._models = {model.name: model for model in models or []}
        self.adapters = LoraLibrary()

    def get(self, name: str, tenant: TenantPolicy) -> ServedModel:
        """The model or LoRA adapter (``adapter`` or ``base:adapter``) called ``name``, if the
        ``tenant`` may use it (and its base model); else the same 404 ``model_not_found`` as
        for a name that does not exist."""
        model = self._models.get(name)
        if model is not None:
            if not tenant.allows_model(name):
                raise unknown_model(name)
            return model
        found = self.adapters.find(name)
        base = self._models.get(found.base) if found is not None else None
        if found is None or base is None:
            raise unknown_model(name)
        if not (tenant.allows_model(base.name) and tenant.allows_adapter(found.name)):
            raise unknown_model(name)
        route = dataclasses.replace(base.route, name=name)
        return dataclasses.replace(base, route=route, adapter=found.adapter, base=base.name)

    def base_model(self, name: str) -> ServedModel | None:
        """The base model called ``name`` (adapters not included)."""
        return self._models.get(name)

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)

    def replace(self, models: list[ServedModel]) -> None:
        """Install the models loaded at start-up."""
        self._models = {model.name: model for model in models}


def load_model(route: ModelRoute, executor: Executor) -> ServedModel:
    """Load one model's tokenizer and template (blocking: call from a worker thread); one that
    cannot be loaded (no such folder, a hub id the hub refuses or cannot be reached for) is a
    ``SettingsError`` naming the model and the reason."""
    try:
        tokenizer = PromptTokenizer.load(
            route.tokenizer_dir,
            executor,
            chat_template_file=route.chat_template_file,
            add_special_tokens=route.add_special_tokens,
            skip_special_tokens=route.skip_special_tokens is not False,
        )
    except (OSError, ValueError) as exc:
        where = route.tokenizer_dir
        reason = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        if Path(where).expanduser().is_dir():
            message = f"model {route.name!r}: cannot load the tokenizer in {where}: {reason}"
        else:
            message = (
                f"model {route.name!r}: no tokenizer folder {where!r}, and as a Hugging Face "
                f"hub id it fails: {reason}"
            )
        raise SettingsError(message) from exc
    tokenizer = decoding(
        tokenizer,
        route.name,
        route.skip_special_tokens,
        route.tool_call_format,
        route.reasoning_parser,
        postprocessing=route.postprocessing,
    )
    context_length = route.context_length or tokenizer.model_max_length or DEFAULT_CONTEXT_LENGTH
    tool_format, reasoning = model_formats(
        route.tool_call_format, route.reasoning_parser, tokenizer.template_text
    )
    logger.info(
        "model %s -> %s/%s (context %d tokens)",
        route.name,
        route.target.url,
        route.target.triton_model,
        context_length,
    )
    vision = read_vision(route.tokenizer_dir, route.images, tokenizer.token_text)
    return ServedModel(
        route=route,
        tokenizer=tokenizer,
        context_length=context_length,
        created=int(time.time()),
        tool_format=tool_format,
        reasoning=reasoning,
        vision=vision,
    )
