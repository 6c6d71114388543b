"""The deployment spec: which models a set of tritonserver sidecars serve, loaded from YAML."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
RELEASES = ("v0.8", "v0.11", "v0.19", "latest")
Release = Literal["v0.8", "v0.11", "v0.19", "latest"]
PIPELINE_MODELS = (
    "preprocessing",
    "tensorrt_llm",
    "postprocessing",
    "ensemble",
    "tensorrt_llm_bls",
)


class SpecError(ValueError):
    """A spec that cannot be served: bad YAML, a bad value, or a missing file."""


class TorchEngine(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="torch", tag_field="kind"
):
    """The project's PyTorch engine for the ``tensorrt_llm`` model (Hugging Face causal LMs)."""

    model_dir: str
    """A Hugging Face model directory or hub id (or ``tiny`` / ``smollm2``)."""
    device: str = "auto"
    """Torch device: ``auto`` (CUDA when the machine has it, else the CPU), ``cpu``, ``cuda`` or
    ``cuda:N``."""
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """Weights and activations dtype; ``auto`` is float32 on CPU and bfloat16 on CUDA."""
    max_batch_size: int = 16
    """Most sequences decoded together by in-flight batching."""
    max_seq_len: int = 4096
    """Most tokens of prompt plus output for one sequence."""
    lora_cache_size: int = 8
    """LoRA adapters the engine keeps (least recently used evicted); a request for an evicted
    one is answered with TensorRT-LLM's "not found in cache" error, and the gateway resends."""
    guided_decoding: bool = True
    """Guided decoding with xgrammar (``guided_decoding_backend: xgrammar``): JSON, JSON schema,
    regex, EBNF and structural-tag guides, which ``response_format`` and tool calls use."""
    guided_decoding_compile_timeout_ms: int | None = None
    """How long a request waits for its grammar to compile before it fails with a 400 (engine
    default 5000); grammars compile beside the decode steps, which never wait for them."""
    guided_decoding_max_compiles: int | None = None
    """Grammars compiled at once (engine default 2); more wait their turn, within the timeout."""
    guided_decoding_cache_mb: int | None = None
    """Compiled grammars kept by content, in MiB (engine default 256)."""
    enable_kv_cache_reuse: bool | None = None
    """Prefix reuse across requests: full KV-cache blocks of earlier prompts and answers stay
    cached, and a prompt prefills only what is not (engine default true, as the C++ backend's)."""
    enable_chunked_context: bool | None = None
    """Prefill long prompts in chunks of at most ``max_num_tokens`` tokens between decode steps
    of the running batch (default false)."""
    kv_cache_free_gpu_mem_fraction: float | None = None
    """On CUDA, the share of the memory left free by the model that the KV cache takes (engine
    default 0.9)."""
    max_tokens_in_paged_kv_cache: int | None = None
    """Tokens the KV cache holds at most; on the CPU its size (default ``max_batch_size`` times
    ``max_seq_len``: every running sequence fits at full length)."""
    tokens_per_block: int = 32
    """Tokens of one KV-cache block, the unit of reuse and of the block metrics."""
    max_num_tokens: int | None = None
    """Most prompt tokens prefilled in one iteration (engine default 8192)."""
    mixed_batching: bool = True
    """Prompt chunks run in the decode step's forward pass, packed with the running rows, as
    TensorRT-LLM's in-flight batching runs context and generation together (where the model's
    attention allows it: checked at load, else a pass per prompt)."""
    max_beam_width: int = 1
    """Widest beam search a request may ask for (``beam_width``); each beam takes a row of
    ``max_batch_size``."""
    kv_transfer_timeout_ms: int | None = None
    """Disaggregated serving: how long a context-only request's KV-cache blocks wait for a
    generation engine to take them before they are freed (engine default 30000)."""


class TensorRTLLMEngine(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="tensorrtllm", tag_field="kind"
):
    """The real TensorRT-LLM C++ backend (NGC Triton TensorRT-LLM container)."""

    engine_dir: str
    """Directory of the built TensorRT-LLM engine."""
    gpu_device_ids: str | None = None
    """GPUs of this model's executor, e.g. ``0,1``; ``;`` separates instances."""
    participant_ids: str | None = None
    """MPI ranks of the executor when orchestrator spawning is disabled."""
    batching_strategy: Literal["inflight_fused_batching", "inflight_batching", "V1"] = (
        "inflight_fused_batching"
    )
    """TensorRT-LLM ``gpt_model_type``."""
    batch_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] = (
        "guaranteed_no_evict"
    )
    """Scheduler policy of the executor."""
    kv_cache_free_gpu_mem_fraction: float | None = None
    """Share of free GPU memory given to the KV cache (backend default 0.9)."""
    max_tokens_in_paged_kv_cache: int | None = None
    """Cap on KV-cache tokens."""
    enable_kv_cache_reuse: bool | None = None
    """Prefix reuse across requests (backend default true)."""
    enable_chunked_context: bool | None = None
    """Chunked prefill (backend default false)."""
    max_beam_width: int = 1
    """Beam width the engine was built for."""
    lora_cache_optimal_adapter_size: int | None = None
    """Optimal LoRA adapter size for cache pages (backend default 8)."""
    lora_cache_max_adapter_size: int | None = None
    """Largest LoRA adapter size (backend default 64)."""
    lora_cache_gpu_memory_fraction: float | None = None
    """GPU memory share of the LoRA cache (backend default 0.05)."""
    lora_cache_host_memory_bytes: int | None = None
    """Host LoRA cache size (backend default 1 GB)."""
    lora_prefetch_dir: str | None = None
    """Directory of ``<task id>/model.lora_*.npy`` loaded at start."""
    parameters: dict[str, str] = {}
    """Any other ``tensorrt_llm`` template placeholder, by name."""


class LoadTestEngine(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="loadtest", tag_field="kind"
):
    """A load-test stand-in for the ``tensorrt_llm`` model, only for benchmarks: no model, made-up
    tokens (meaningless text) on a TensorRT-LLM engine's schedule.

    Unpaced (the default) it answers every request at once, so a benchmark measures the serving
    overhead alone; paced (``token_s``, ``prompt_token_s``) each stream gets tokens at a set
    rate, like an engine on a GPU, while costing the host almost nothing.
    """

    tokenizer_dir: str
    """Tokenizer folder, hub id or built-in name (``tiny``, ``smollm2``) of the pipeline's pre-
    and postprocessing; the load-test model itself never loads it."""
    token_id: int | None = None
    """The token id every output position holds; by default the request's own ``input_ids`` in
    a cycle (never ``end_id``), so the detokenized text is made of real words."""
    token_s: float = 0.0
    """Seconds between two output tokens of a stream (0.0125 is 80 tokens/s); 0: at once."""
    prompt_token_s: float = 0.0
    """Seconds per prompt token before a stream's first token (the prefill)."""
    max_batch_size: int = 4096
    """Streams paced at once per instance; more wait their turn."""
    instances: int = 1
    """Instances of the model (each a Python-backend process) that share the requests."""
    senders: int = 4
    """Threads of each instance that send its responses, a request's all from the same one.
    Each send waits for tritonserver to take the response (a round trip between processes),
    where the C++ backend's sends cost it next to nothing: with one thread, a stream's first
    response waits behind every response due before it."""


EngineSpec = TorchEngine | TensorRTLLMEngine | LoadTestEngine


class ModelSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One served pipeline: the five TensorRT-LLM models under a common name prefix."""

    name: str
    """Pipeline name; Triton models are called ``<name>_ensemble``, ``<name>_tensorrt_llm``..."""
    engine: EngineSpec
    """The ``tensorrt_llm`` model's engine."""
    release: Release = "v0.19"
    """TensorRT-LLM release whose model configs are rendered: ``v0.8``, ``v0.11``, ``v0.19``, or
    ``latest`` (TensorRT-LLM 1.x ``triton_backend``: ``min_tokens``/``seed`` and token counts)."""
    tokenizer_dir: str | None = None
    """Tokenizer directory or hub id; defaults to the torch engine's ``model_dir`` or the load-test
    engine's ``tokenizer_dir``."""
    triton_max_batch_size: int = 64
    """``max_batch_size`` of every model config."""
    decoupled: bool = True
    """Decoupled (streaming) transaction policy for ``tensorrt_llm`` and the BLS."""
    accumulate_tokens: bool = False
    """BLS streaming sends cumulative text instead of deltas."""
    add_special_tokens: bool = True
    """Preprocessing adds the tokenizer's special tokens (BOS) to the prompt."""
    skip_special_tokens: bool = True
    """Postprocessing drops special tokens from text."""
    preprocessing_instances: int = 1
    """Instances of the preprocessing model."""
    bls_instances: int = 1
    """Instances of the BLS model."""
    exclude_input_in_output: bool = False
    """Engine-side default for leaving the prompt out of non-streamed output."""
    text_python_env: str | None = None
    """Python environment folder (the Python backend's ``EXECUTION_ENV_PATH``) of the models that
    carry text: preprocessing, postprocessing and the BLS. Triton 2.51's stub garbles string
    tensors under numpy 2, so where the engine's environment has numpy 2 (CUDA machines) these
    run in one with numpy < 2 (``python -m deploy.devtools.offline install`` makes one). The
    load-test engine's ``tensorrt_llm`` model, all numpy, runs there too."""
    vision_model: str | None = None
    """A Llava-style checkpoint (folder or built-in name, usually the engine's ``model_dir``)
    whose vision tower and projector a ``multimodal_encoders`` model runs: the pipeline then
    takes images (releases v0.19 and latest)."""

    @property
    def prefix(self) -> str:
        """Prefix of this pipeline's Triton model names."""
        return f"{self.name}_"

    def triton_name(self, model: str) -> str:
        """The Triton name of one of the five pipeline models."""
        return f"{self.prefix}{model}"

    @property
    def tokenizer(self) -> str:
        """The tokenizer location actually used."""
        if self.tokenizer_dir is not None:
            return self.tokenizer_dir
        if isinstance(self.engine, TorchEngine):
            return self.engine.model_dir
        if isinstance(self.engine, LoadTestEngine):
            return self.engine.tokenizer_dir
        raise SpecError(f"model {self.name!r}: tokenizer_dir is required for a tensorrtllm engine")


class SidecarSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One tritonserver process and the pipelines it hosts."""

    name: str = "main"
    """Sidecar name, used in logs and shared-memory prefixes."""
    models: list[str] | None = None
    """Pipelines hosted here; ``None`` means every model of the spec."""
    tritonserver: str | None = None
    """tritonserver binary; defaults to the one inside the nvidia-pytriton wheel."""
    backend_directory: str | None = None
    """Backends folder; defaults to the one beside the binary."""
    host: str = "127.0.0.1"
    """Address the HTTP and gRPC endpoints bind to."""
    http_port: int = 0
    """HTTP port; 0 picks a free one."""
    grpc_port: int = 0
    """gRPC port; 0 picks a free one."""
    metrics_port: int = 0
    """Metrics port; 0 picks a free one."""
    startup_timeout_s: float = 300.0
    """How long to wait for readiness."""
    max_restarts: int = 5
    """Restarts after crashes before giving up."""
    stop_grace_s: float = 15.0
    """On stop, how long tritonserver gets to unload its models after SIGTERM before its process
    group is killed; 0 kills at once. Shared-memory leftovers are removed either way."""
    log_verbose: int = 0
    """tritonserver ``--log-verbose`` level."""
    extra_args: list[str] = []
    """Further tritonserver arguments."""
    env: dict[str, str] = {}
    """Further environment variables for tritonserver."""
    keep_responses: bool = True
    """Preload the response keeper (``deploy.sidecar.frontend.keeper``) into tritonserver, so
    that its HTTP frontend waits instead of losing a streamed response when it falls behind
    (docs/operations/response-keeper.md). Built once on this host with its C compiler; without
    one the sidecar runs without it. The gateway preloads it only where a model of the sidecar
    may take HTTP; ``false`` leaves it out, and models left to ``transport: auto`` there take
    gRPC."""


class Spec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A whole deployment: served pipelines and the sidecars hosting them."""

    models: list[ModelSpec]
    """Served pipelines."""
    sidecars: list[SidecarSpec] = msgspec.field(default_factory=lambda: [SidecarSpec()])
    """tritonserver processes; by default one hosting every model. A model hosted by several
    is served by all of them, as replicas the gateway routes among."""

    def model(self, name: str) -> ModelSpec:
        """The pipeline called ``name``."""
        for model in self.models:
            if model.name == name:
                return model
        raise SpecError(f"no model named {name!r} in the spec")

    def models_of(self, sidecar: SidecarSpec) -> list[ModelSpec]:
        """The pipelines one sidecar hosts."""
        if sidecar.models is None:
            return list(self.models)
        return [self.model(name) for name in sidecar.models]


def parse_spec(data: Any, *, base_dir: Path | None = None) -> Spec:
    """Validate a spec from plain data; relative paths are taken from ``base_dir``."""
    try:
        spec = msgspec.convert(data, Spec, strict=False)
    except msgspec.ValidationError as exc:
        raise SpecError(f"invalid spec: {exc}") from exc
    if base_dir is not None:
        spec = _resolve_paths(spec, base_dir)
    _check(spec)
    return spec


def load_spec(path: str | Path) -> Spec:
    """Read and validate a YAML spec file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise SpecError(f"spec file not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"spec file {path} is not valid YAML: {exc}") from exc
    return parse_spec(data, base_dir=path.resolve().parent)


def looks_like_path(value: str) -> bool:
    """Whether a model location is meant as a local path rather than a hub id or alias."""
    return value.startswith(("/", "./", "../", "~"))


def _resolve(value: str | None, base_dir: Path) -> str | None:
    if value is None or not looks_like_path(value):
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base_dir / path).resolve())


def _resolve_paths(spec: Spec, base_dir: Path) -> Spec:
    models = []
    for model in spec.models:
        engine: EngineSpec
        if isinstance(model.engine, TorchEngine):
            model_dir = _resolve(model.engine.model_dir, base_dir)
            engine = msgspec.structs.replace(model.engine, model_dir=model_dir or "")
        elif isinstance(model.engine, LoadTestEngine):
            tokenizer_dir = _resolve(model.engine.tokenizer_dir, base_dir)
            engine = msgspec.structs.replace(model.engine, tokenizer_dir=tokenizer_dir or "")
        else:
            engine_dir = _resolve(model.engine.engine_dir, base_dir)
            engine = msgspec.structs.replace(model.engine, engine_dir=engine_dir or "")
        models.append(
            msgspec.structs.replace(
                model,
                engine=engine,
                tokenizer_dir=_resolve(model.tokenizer_dir, base_dir),
                text_python_env=_resolve(model.text_python_env, base_dir),
                vision_model=_resolve(model.vision_model, base_dir),
            )
        )
    return msgspec.structs.replace(spec, models=models)


def _check_engine(model: ModelSpec) -> None:
    if isinstance(model.engine, TorchEngine):
        _check_torch(model.name, model.engine)
    if isinstance(model.engine, LoadTestEngine):
        _check_load_test(model.name, model.engine)


def _check_torch(name: str, engine: TorchEngine) -> None:
    counts = {
        "max_batch_size": engine.max_batch_size,
        "tokens_per_block": engine.tokens_per_block,
        "max_num_tokens": engine.max_num_tokens,
        "max_tokens_in_paged_kv_cache": engine.max_tokens_in_paged_kv_cache,
        "max_beam_width": engine.max_beam_width,
    }
    for field, value in counts.items():
        if value is not None and value < 1:
            raise SpecError(f"model {name!r}: engine {field} must be >= 1")
    if engine.max_beam_width > engine.max_batch_size:
        raise SpecError(f"model {name!r}: engine max_beam_width must not exceed max_batch_size")
    fraction = engine.kv_cache_free_gpu_mem_fraction
    if fraction is not None and not 0.0 < fraction <= 1.0:
        raise SpecError(f"model {name!r}: engine kv_cache_free_gpu_mem_fraction must be in (0, 1]")


def _check_load_test(name: str, engine: LoadTestEngine) -> None:
    if (engine.token_id or 0) < 0:
        raise SpecError(f"model {name!r}: engine token_id must be >= 0")
    if engine.token_s < 0 or engine.prompt_token_s < 0:
        raise SpecError(f"model {name!r}: engine token_s and prompt_token_s must be >= 0")
    if min(engine.max_batch_size, engine.instances, engine.senders) < 1:
        raise SpecError(
            f"model {name!r}: engine max_batch_size, instances and senders must be >= 1"
        )


def _check(spec: Spec) -> None:
    if not spec.models:
        raise SpecError("the spec serves no models")
    seen: set[str] = set()
    for model in spec.models:
        if not MODEL_NAME.match(model.name):
            raise SpecError(f"model name {model.name!r} must match {MODEL_NAME.pattern}")
        if model.name in seen:
            raise SpecError(f"model name {model.name!r} appears twice")
        seen.add(model.name)
        if model.triton_max_batch_size < 1:
            raise SpecError(f"model {model.name!r}: triton_max_batch_size must be >= 1")
        _check_engine(model)
        if model.vision_model is not None and model.release not in ("v0.19", "latest"):
            raise SpecError(
                f"model {model.name!r}: vision_model needs release v0.19 or latest "
                f"(the image inputs of the configs), not {model.release}"
            )
    names = {s.name for s in spec.sidecars}
    if len(names) != len(spec.sidecars):
        raise SpecError("sidecar names must be unique")
    for sidecar in spec.sidecars:
        if sidecar.stop_grace_s < 0:
            raise SpecError(f"sidecar {sidecar.name!r}: stop_grace_s must be >= 0")
    # A pipeline hosted by several sidecars has them as replicas (one per GPU, say).
    hosted = {model.name for sidecar in spec.sidecars for model in spec.models_of(sidecar)}
    missing = seen - hosted
    if missing:
        raise SpecError(f"models not hosted by any sidecar: {sorted(missing)}")
