"""The gateway's configuration: one frozen, typed object loaded from one YAML file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from adapters.contract import EntryModel
from gateway.observability import ObservabilitySettings
from gateway.queueing.settings import QueueSettings, check_queueing
from gateway.replicas.settings import EndpointSettings, RoutingSettings, check_routing
from gateway.tenancy.config import TenancyConfigError, TenancySettings, check_tenancy

Transport = Literal["auto", "grpc", "http"]

ToolCallFormat = Literal[
    "hermes",
    "llama3_json",
    "mistral",
    "pythonic",
    "qwen3_coder",
    "glm45",
    "deepseek_v3",
    "kimi_k2",
    "harmony",
]
ReasoningParser = Literal["think", "harmony", "none"]


class SettingsError(ValueError):
    """A configuration file that cannot be read or does not validate."""


class SamplingDefaults(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Sampling values used when a request leaves the field out."""

    temperature: float | None = None
    """Default ``temperature``; ``None`` leaves the engine's default."""
    top_p: float | None = None
    """Default ``top_p``."""
    top_k: int | None = None
    """Default ``top_k``."""
    presence_penalty: float | None = None
    """Default ``presence_penalty``."""
    frequency_penalty: float | None = None
    """Default ``frequency_penalty``."""
    repetition_penalty: float | None = None
    """Default ``repetition_penalty``."""
    min_tokens: int | None = None
    """Default ``min_tokens``."""
    max_tokens: int | None = None
    """Default completion length; ``None`` means the rest of the context window."""


class AdapterSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A LoRA adapter served on a model: requests name it as their ``model``."""

    name: str
    """Public name (also reachable as ``<model>:<name>``)."""
    path: str
    """A TensorRT-LLM folder (``model.lora_weights.npy``, ``model.lora_config.npy``) or a
    Hugging Face PEFT folder (``adapter_config.json``, ``adapter_model.safetensors``)."""


class ImageSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a model that takes images gets them from ``image_url`` content parts."""

    fetch_http: bool = False
    """Fetch ``http(s)`` image URLs; off, only ``data:`` URLs are taken."""
    allow_private_networks: bool = False
    """Let fetched URLs reach loopback, private and link-local addresses."""
    max_bytes: Annotated[int, msgspec.Meta(ge=1)] = 20 * 1024 * 1024
    """Largest image, encoded, in bytes."""
    max_pixels: Annotated[int, msgspec.Meta(ge=1)] = 40_000_000
    """Largest image in pixels (width times height)."""
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    """Time limit of one fetch."""
    max_redirects: Annotated[int, msgspec.Meta(ge=0)] = 3
    """Redirects one fetch may follow."""
    max_images: Annotated[int, msgspec.Meta(ge=1)] = 8
    """Most images in one request."""


class ModelSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One served model: its public name, where it runs in Triton and how to template for it."""

    name: str = "default"
    """Public model id that clients send as ``model``."""
    pipeline: str | None = None
    """Pipeline of the ``sidecars`` spec that serves this model; fills the fields left unset."""
    entry: EntryModel = "ensemble"
    """Which pipeline model to call: ``ensemble``, ``tensorrt_llm_bls``, or ``tensorrt_llm``
    itself (the gateway then tokenizes and detokenizes, skipping two Python-backend steps per
    request and per streamed chunk)."""
    triton_url: str | None = None
    """Triton gRPC ``host:port``; defaults to the pipeline's sidecar, else 127.0.0.1:8001."""
    transport: Transport = "auto"
    """How requests reach Triton, decided once at start (logged, and in ``/metrics`` as
    ``gateway_triton_transport_info``). ``grpc``: ``ModelStreamInfer``. ``http``: Triton's HTTP
    ``generate_stream``, about a third of gRPC's CPU per token in the gateway and a shorter way
    to the first token, but Triton's HTTP frontend loses responses when it falls behind unless
    its tritonserver runs the response keeper (docs/operations/response-keeper.md): take it for
    a Triton of your own only where it does. ``auto``: HTTP for a model of supervised sidecars
    that all run the keeper, else gRPC. Requests with LoRA weights, beams, or a BLS answering
    once go over gRPC either way."""
    triton_http_url: str | None = None
    """The same Triton's HTTP address (``http://host:port``) for ``transport: http``; the
    pipeline's sidecar's by default."""
    triton_model: str | None = None
    """Triton model to call, e.g. ``tiny_ensemble``; defaults to ``<pipeline>_<entry>``."""
    engine_model: str | None = None
    """The ``tensorrt_llm`` model behind ``triton_model`` (stop requests go there)."""
    tokenizer_dir: str | None = None
    """Hugging Face tokenizer folder; defaults to the pipeline's tokenizer."""
    chat_template: str | None = None
    """Jinja chat template file that overrides the tokenizer's own template."""
    context_length: int | None = None
    """Most prompt plus completion tokens; defaults to the engine's ``max_seq_len``, else 4096."""
    add_special_tokens: bool | None = None
    """Whether Triton's preprocessing adds special tokens (BOS); defaults to the pipeline's."""
    count_prompts: bool | None = None
    """Whether a text prompt's ``usage.prompt_tokens`` is the gateway's own count, so that the
    engine is not asked for ``num_input_tokens`` in every streamed response. By default true for
    a pipeline of this gateway's sidecars (its preprocessing reads the same tokenizer folder with
    the same ``add_special_tokens``) when none of ``triton_url``, ``tokenizer_dir`` and
    ``add_special_tokens`` is set, false otherwise. Set it for a Triton of your own whose
    preprocessing tokenizes as ``tokenizer_dir`` and ``add_special_tokens`` say. A vision model's
    prompts are counted by the engine either way."""
    skip_special_tokens: bool | None = None
    """Whether generated special tokens are left out of the text (entry ``tensorrt_llm``, where
    the gateway decodes). Unset: all are left out but those the model's ``tool_call_format``
    and ``reasoning_parser`` read (gpt-oss's channels, DeepSeek's and Kimi's call markers),
    which their parsers consume; false (or a pipeline whose postprocessing keeps them): all
    are kept; true: all are left out, a start-up error where the formats read some."""
    max_n: int = 8
    """Largest ``n`` (choices per prompt) a request may ask for."""
    defaults: SamplingDefaults = SamplingDefaults()
    """Sampling values used when a request leaves a field out."""
    owned_by: str = "triton-gateway"
    """``owned_by`` shown by ``/v1/models``."""
    adapters: tuple[AdapterSettings, ...] = ()
    """LoRA adapters served on this model, loaded at start-up."""
    tool_call_format: ToolCallFormat | None = None
    """How the model writes tool calls: ``hermes`` (Hermes, Qwen 2.5/3), ``llama3_json``,
    ``mistral``, ``pythonic`` (Llama 3.2/4), ``qwen3_coder`` (Qwen3-Coder's XML), ``glm45``
    (GLM 4.5+), ``deepseek_v3`` (DeepSeek V3, R1, V3.1), ``kimi_k2``, ``harmony`` (gpt-oss);
    guessed from the chat template when unset."""
    reasoning_parser: ReasoningParser | None = None
    """How the model's reasoning is split from its answer into ``reasoning_content``:
    ``think`` (``<think>…</think>``: DeepSeek-R1, Qwen3, SmolLM3, GLM 4.5+), ``harmony``
    (gpt-oss's ``analysis`` channel), ``none``; guessed from the chat template when unset.
    The special tokens a format reads are kept in the text unless ``skip_special_tokens`` is
    set."""
    tokens_per_block: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """The engine's KV-cache block size, which turns its reused blocks into the prompt's
    ``cached_tokens``; needed only where the engine's config does not state it (rendered
    pipelines do; a C++ engine keeps it in its build, ``plugin_config.tokens_per_block``)."""
    replicas: tuple[str | EndpointSettings, ...] | str = ()
    """Several Tritons serving this model, instead of ``triton_url``: a list of ``host:port``
    (or ``{url, metrics_url, name}``), or ``dns:HOST:PORT``, a name resolved again every
    ``routing.resolve_interval_s`` (a Kubernetes headless Service). A pipeline hosted by several
    sidecars has its sidecars as replicas without this."""
    routing: RoutingSettings = RoutingSettings()
    """How requests are spread over the replicas and when a replica is taken out."""
    images: ImageSettings = ImageSettings()
    """How image inputs are taken, for a model whose checkpoint has a vision tower."""
    shared_kv_cache: bool = False
    """Let every tenant share this model's cached prompts, whatever their cache scopes: no
    ``cache_salt_id`` is sent. Needed to serve several tenants from an engine that reuses its KV
    cache but whose config declares no ``cache_salt_id`` (the stock configs); a tenant can then
    tell from ``cached_tokens`` and from the time to the first token what others sent."""


class RequestBounds(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The size of one request, checked before any of it is tokenized or planned; a request
    over a bound gets a 400 naming the field, counted against the tenant's request limit."""

    max_choices: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Most engine sequences one request may start: prompts times ``n`` (times the beam width
    of a beam search); unset: the engine's ``max_batch_size`` where the sidecars' spec gives it,
    else 64. A tenant's ``max_choices`` overrides it."""
    max_prompts: Annotated[int, msgspec.Meta(ge=1)] = 64
    """Most prompts in one ``/v1/completions`` request."""
    max_prompt_bytes: Annotated[int, msgspec.Meta(ge=1)] = 1024 * 1024
    """Most UTF-8 bytes of prompt text (every prompt, or every message's text) in one request."""
    max_stop_sequences: Annotated[int, msgspec.Meta(ge=0)] = 16
    """Most ``stop`` sequences in one request."""
    max_stop_bytes: Annotated[int, msgspec.Meta(ge=0)] = 4096
    """Most UTF-8 bytes of all the ``stop`` sequences of one request together."""
    max_guide_bytes: Annotated[int, msgspec.Meta(ge=1)] = 64 * 1024
    """Most bytes of a ``response_format`` guide (JSON schema, regex or grammar), and of all the
    ``tools``' parameter schemas together."""
    max_guide_depth: Annotated[int, msgspec.Meta(ge=1)] = 64
    """Deepest nesting of JSON objects and arrays in a ``response_format`` JSON schema or a
    tool's parameters schema (an object property nested in another takes two levels)."""


class LimitSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Bounds that keep one request from hurting the others."""

    bounds: RequestBounds = RequestBounds()
    """The size of one request: choices, prompts, stop sequences and guides."""

    max_body_bytes: Annotated[int, msgspec.Meta(ge=1)] = 4 * 1024 * 1024
    """Largest accepted request body; larger ones get 413."""
    request_timeout_s: float = 600.0
    """Longest a generation may take, streaming or not, before it is cancelled."""
    readiness_timeout_s: float = 2.0
    """How long ``/health/ready`` waits for each model's answer from Triton."""
    shutdown_grace_s: float = 30.0
    """How long shutdown waits for in-flight requests and streams to finish (the drain timeout)."""
    drain_delay_s: float = 5.0
    """On SIGTERM, how long readiness answers 503 while requests are still served, so load
    balancers stop sending before new requests are refused with 503."""
    tokenizer_threads: int = 2
    """Threads that template and count tokens off the event loop."""
    triton_keep_alive_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    """How long a connection to a Triton's HTTP frontend, idle after a stream that ended
    cleanly, is kept for the next request (``transport: http``). 0 opens a connection per
    request, as a load balancer between the gateway and Triton that spreads connections
    rather than requests needs."""
    retry_after_s: int = 5
    """``Retry-After`` seconds sent with 503 answers."""


class SidecarSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Sidecars the gateway starts and supervises itself, described by a deploy spec."""

    spec: str | None = None
    """Deploy spec YAML file; relative paths are taken from the settings file's folder."""
    inline: dict[str, Any] | None = None
    """The deploy spec given inline, in the same schema as the file."""
    workdir: str | None = None
    """Folder for rendered repositories and logs; a temporary folder when unset."""


class ServerSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where the HTTP server listens, and what one client may hold of it before its request
    reaches the app (each worker process keeps these bounds on its own)."""

    host: str = "127.0.0.1"
    """Address to bind."""
    port: int = 8000
    """Port to bind."""
    workers: Annotated[int, msgspec.Meta(ge=1)] = 1
    """Gateway processes serving the port. One process streams about 10k tokens/s; above that
    give it several (up to about half the host's cores: Triton needs the rest). The default is
    one: nothing more to run, and the limits live in memory unless a Redis store is set; with
    more, and no Redis configured, the gateway runs one itself to keep them exact."""
    keep_alive_s: Annotated[int, msgspec.Meta(ge=1)] = 75
    """How long an idle client connection stays open. Longer than the clients' own idle expiry
    (httpx's 5 s, so the openai SDK's and LangChain's), so that a client never sends on a
    connection the gateway is closing; a load balancer in front should idle out first."""
    max_head_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 32 * 1024
    """Largest request head (request line and headers); a larger one gets 431, unread."""
    head_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    """Longest a request head may take to arrive, from its first byte (from the connection's
    start for its first request); a late one gets 408, a connection that sent nothing a close."""
    body_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    """Longest a request body may take to arrive after its head; a late one gets 408."""
    max_connections: Annotated[int, msgspec.Meta(ge=1)] = 4096
    """Most open client connections per worker process; one more gets 503 and is closed."""
    max_connections_per_peer: Annotated[int, msgspec.Meta(ge=1)] = 2048
    """Most open connections per worker process from one client address (a reverse proxy in
    front is one address: raise this to ``max_connections`` there); one more gets 503."""


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything the gateway needs to run."""

    models: tuple[ModelSettings, ...] = ()
    """Served models; empty with ``sidecars`` set means every pipeline of the spec."""
    limits: LimitSettings = LimitSettings()
    """Request limits and timeouts."""
    sidecars: SidecarSettings | None = None
    """Sidecars to start and supervise; ``None`` means Triton runs elsewhere."""
    server: ServerSettings = ServerSettings()
    """HTTP listener of ``triton-gateway serve``."""
    tenancy: TenancySettings = TenancySettings()
    """API keys, tenants, their limits and where the limits are counted (auth is on)."""
    log_level: str = "INFO"
    """Logging level of the ``triton-gateway`` command."""
    observability: ObservabilitySettings = ObservabilitySettings()
    """Log format (text or JSON), OpenTelemetry tracing, and who may read the metrics."""
    queueing: QueueSettings = QueueSettings()
    """How requests wait, in fair per-tenant queues, for a model at its
    ``routing.max_in_flight``."""


def _split_problem(model: ModelSettings) -> str | None:
    """Why the model cannot split its requests between two pools, where it is asked to."""
    if model.routing.disaggregation is None:
        return None
    if model.entry != "tensorrt_llm":
        return "routing.disaggregation needs entry tensorrt_llm (the engine splits requests)"
    if model.pipeline is not None and not model.replicas:
        # The pools are its pipeline's context and generation sidecars, checked at start.
        return None
    if not model.replicas:
        return (
            "routing.disaggregation needs replicas: the generation pool (or a pipeline "
            "hosted by context and generation sidecars)"
        )
    if not model.routing.disaggregation.context_replicas:
        return "routing.disaggregation.context_replicas names no replica"
    return None


def check_settings(settings: Settings) -> None:
    """Reject settings whose parts contradict each other, before anything starts."""
    for model in settings.models:
        problems = check_routing(model.routing)
        if problems:
            raise SettingsError(f"model {model.name!r}: routing: {'; '.join(problems)}")
        if model.replicas and model.triton_url is not None:
            raise SettingsError(
                f"model {model.name!r}: set triton_url (one Triton) or replicas (several), not both"
            )
        problem = _transport_problem(model) or _split_problem(model)
        if problem is not None:
            raise SettingsError(f"model {model.name!r}: {problem}")
    problems = check_queueing(settings.queueing)
    if problems:
        raise SettingsError(f"queueing: {'; '.join(problems)}")
    try:
        check_tenancy(settings.tenancy)
    except TenancyConfigError as exc:
        raise SettingsError(f"invalid tenancy settings: {exc}") from exc
    if settings.server.workers > 1 and settings.tenancy.store.kind == "memory":
        raise SettingsError(
            f"tenancy.store.kind: memory counts limits in each of the {settings.server.workers} "
            "workers apart: leave tenancy.store.kind unset (the embedded store), or set "
            "kind: embedded or kind: redis"
        )
    metrics = settings.observability.metrics
    if metrics.auth == "admin" and settings.tenancy.admin_key_sha256 is None:
        raise SettingsError(
            "observability.metrics.auth: admin needs the admin key (tenancy.admin_key_sha256)"
        )
    if metrics.port is not None and metrics.port == settings.server.port:
        raise SettingsError(
            f"observability.metrics.port {metrics.port} is the API's port (server.port): "
            "leave it unset to serve the metrics there, or pick another port"
        )


def sidecar_served(model: ModelSettings) -> bool:
    """Whether the model runs on the sidecars this gateway supervises: its pipeline's, with no
    other Triton named."""
    return model.pipeline is not None and model.triton_url is None and not model.replicas


def _transport_problem(model: ModelSettings) -> str | None:
    """Why the model's HTTP addresses do not fit its ``transport`` (None when they do)."""
    listed = () if isinstance(model.replicas, str) else model.replicas
    endpoints = [e for e in listed if isinstance(e, EndpointSettings)]
    if model.transport != "http":
        addresses = {"triton_http_url": model.triton_http_url,
                     "routing.http_port": model.routing.http_port}  # fmt: skip
        addresses |= {f"http_url of replica {e.url}": e.http_url for e in endpoints}
        given = [name for name, value in addresses.items() if value is not None]
        if given:
            return f"{', '.join(given)} is used only with transport: http"
        return None
    if model.triton_http_url == "" or any(e.http_url == "" for e in endpoints):
        return "an empty HTTP address"
    if model.replicas:
        if model.triton_http_url is not None:
            return "triton_http_url names one Triton: replicas take routing.http_port or http_url"
        if model.routing.http_port is not None:
            return None
        missing = [e if isinstance(e, str) else e.url for e in listed
                   if isinstance(e, str) or e.http_url is None]  # fmt: skip
        if isinstance(model.replicas, str) or missing:
            where = model.replicas if isinstance(model.replicas, str) else ", ".join(missing)
            return f"transport: http needs routing.http_port (or http_url) for {where}"
        return None
    if model.triton_http_url is None and not sidecar_served(model):
        return "transport: http needs triton_http_url (a pipeline's sidecar gives its own)"
    return None


def parse_settings(data: Any, *, base_dir: Path | None = None) -> Settings:
    """Validate settings from plain data; relative file paths are taken from ``base_dir``."""
    try:
        settings = msgspec.convert(data if data is not None else {}, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"invalid settings: {exc}") from exc
    return _resolve_paths(settings, base_dir) if base_dir is not None else settings


def load_settings(path: str | Path) -> Settings:
    """Read and validate a YAML settings file."""
    path = Path(path)
    try:
        data = msgspec.yaml.decode(path.read_bytes())
    except FileNotFoundError as exc:
        raise SettingsError(f"settings file not found: {path}") from exc
    except msgspec.DecodeError as exc:
        raise SettingsError(f"settings file {path} is not valid YAML: {exc}") from exc
    return parse_settings(data, base_dir=path.resolve().parent)


def _local_path(value: str | None, base_dir: Path) -> str | None:
    """Paths written ``./x``, ``../x`` or ``~/x`` are local; anything else may be a hub id."""
    if value is None or not value.startswith(("./", "../", "~")):
        return value
    return str((base_dir / Path(value).expanduser()).resolve())


def _file_path(value: str | None, base_dir: Path) -> str | None:
    return None if value is None else _under(value, base_dir)


def _under(value: str, base_dir: Path) -> str:
    return str((base_dir / Path(value).expanduser()).resolve())


def _resolve_paths(settings: Settings, base_dir: Path) -> Settings:
    models = tuple(
        msgspec.structs.replace(
            model,
            tokenizer_dir=_local_path(model.tokenizer_dir, base_dir),
            chat_template=_file_path(model.chat_template, base_dir),
            adapters=tuple(
                msgspec.structs.replace(adapter, path=_under(adapter.path, base_dir))
                for adapter in model.adapters
            ),
        )
        for model in settings.models
    )
    sidecars = settings.sidecars
    if sidecars is not None and sidecars.spec is not None:
        sidecars = msgspec.structs.replace(sidecars, spec=_file_path(sidecars.spec, base_dir))
    store = settings.tenancy.store
    store = msgspec.structs.replace(store, path=_file_path(store.path, base_dir))
    tenancy = msgspec.structs.replace(settings.tenancy, store=store)
    return msgspec.structs.replace(settings, models=models, sidecars=sidecars, tenancy=tenancy)
