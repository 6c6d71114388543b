"""The deployment spec: which models a set of tritonserver sidecars serve, loaded from YAML."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from deploy.sidecar.engines import EngineSpec, LoadTestEngine, TensorRTLLMEngine, TorchEngine

__all__ = [
    "EngineSpec",
    "LoadTestEngine",
    "ModelSpec",
    "SidecarDisaggregation",
    "SidecarSpec",
    "Spec",
    "SpecError",
    "TensorRTLLMEngine",
    "TorchEngine",
    "load_spec",
    "looks_like_path",
    "parse_spec",
    "sidecar_model",
]

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


class SidecarDisaggregation(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A sidecar's part in disaggregated serving, and the KV-cache settings of its engines: the
    gateway sends the context phase of a model's split requests to its ``context`` sidecars
    and the generation phase to its ``generation`` sidecars (the model's
    ``routing.disaggregation``). Its pipelines run the torch engine."""

    phase: Literal["context", "generation"]
    """``context``: prefills prompts, answers their first token and holds their KV cache until
    a generation engine takes it; ``generation``: takes the KV cache and decodes the rest."""
    kv_transfer_timeout_ms: int | None = None
    """How long a context-only request's KV-cache blocks wait for a generation engine to take
    them before they are freed (engine default 30000; the engine's own setting when unset)."""
    kv_cache_free_gpu_mem_fraction: float | None = None
    """On CUDA, the share of the memory free once the model is loaded that this sidecar's KV
    cache takes (the engine's own setting when unset)."""
    max_tokens_in_paged_kv_cache: int | None = None
    """Tokens this sidecar's KV cache holds at most (the engine's own setting when unset): the
    way to share one GPU between a context and a generation sidecar by fixed sizes, each
    process seeing the other's memory as taken or free depending on which loaded first."""


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
    disaggregation: SidecarDisaggregation | None = None
    """Run one phase of disaggregated requests (``phase``) with these KV-cache settings; None:
    whole requests. ``env: {CUDA_VISIBLE_DEVICES: "1"}`` puts a sidecar on its own GPU."""


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


def sidecar_model(model: ModelSpec, sidecar: SidecarSpec) -> ModelSpec:
    """``model`` as ``sidecar`` runs it: a torch engine takes the sidecar's KV-cache settings."""
    split = sidecar.disaggregation
    if split is None or not isinstance(model.engine, TorchEngine):
        return model
    settings = {
        "kv_transfer_timeout_ms": split.kv_transfer_timeout_ms,
        "kv_cache_free_gpu_mem_fraction": split.kv_cache_free_gpu_mem_fraction,
        "max_tokens_in_paged_kv_cache": split.max_tokens_in_paged_kv_cache,
    }
    given = {name: value for name, value in settings.items() if value is not None}
    return msgspec.structs.replace(model, engine=msgspec.structs.replace(model.engine, **given))


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
    if isinstance(model.engine, (TorchEngine, LoadTestEngine)):
        problems = model.engine.problems()
        if problems:
            raise SpecError(f"model {model.name!r}: {problems[0]}")


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
    _check_phases(spec)
    # A pipeline hosted by several sidecars has them as replicas (one per GPU, say).
    hosted = {model.name for sidecar in spec.sidecars for model in spec.models_of(sidecar)}
    missing = seen - hosted
    if missing:
        raise SpecError(f"models not hosted by any sidecar: {sorted(missing)}")


def _check_phase_engine(sidecar: SidecarSpec, model: ModelSpec) -> None:
    """A sidecar running one phase of split requests hosts only engines that split them."""
    phase = sidecar.disaggregation.phase if sidecar.disaggregation else None
    where = f"sidecar {sidecar.name!r} runs the {phase} phase of disaggregated requests"
    if not isinstance(model.engine, TorchEngine):
        raise SpecError(
            f"{where}, which needs the tensorrt_llm model of a torch engine on both sides; "
            f"model {model.name!r} has a {model.engine.__struct_config__.tag} engine"
        )
    if model.release not in ("v0.19", "latest"):
        raise SpecError(
            f"{where}: model {model.name!r} needs release v0.19 or latest (the "
            f"context_phase_params input of the configs), not {model.release}"
        )


def _check_phases(spec: Spec) -> None:
    """Each pipeline runs whole on all its sidecars, or split: context and generation
    sidecars, both with the torch engine and sane KV-cache settings."""
    phases: dict[str, set[str | None]] = {}
    for sidecar in spec.sidecars:
        split = sidecar.disaggregation
        for model in spec.models_of(sidecar):
            phases.setdefault(model.name, set()).add(split.phase if split else None)
            if split is not None:
                _check_phase_engine(sidecar, model)
        if split is None:
            continue
        fraction = split.kv_cache_free_gpu_mem_fraction
        if fraction is not None and not 0.0 < fraction <= 1.0:
            raise SpecError(
                f"sidecar {sidecar.name!r}: disaggregation.kv_cache_free_gpu_mem_fraction "
                "must be in (0, 1]"
            )
        for field in ("kv_transfer_timeout_ms", "max_tokens_in_paged_kv_cache"):
            value = getattr(split, field)
            if value is not None and value < 1:
                raise SpecError(f"sidecar {sidecar.name!r}: disaggregation.{field} must be >= 1")
    _check_shared_gpus(spec)
    for name, found in phases.items():
        if found == {None}:
            continue
        if None in found:
            raise SpecError(
                f"model {name!r} runs on sidecars with and without a disaggregation phase: give "
                "every sidecar hosting it disaggregation.phase context or generation, or none"
            )
        missing = {"context", "generation"} - found
        if missing:
            raise SpecError(
                f"model {name!r} has no {missing.pop()} sidecar: a split model needs a sidecar "
                "with disaggregation.phase context and one with phase generation"
            )


def _check_shared_gpus(spec: Spec) -> None:
    """Phase sidecars of a CUDA engine on the same GPUs must each be given their share of its
    memory: the first to load would otherwise take most of what the other needs."""
    by_gpus: dict[str, list[SidecarSpec]] = {}
    for sidecar in spec.sidecars:
        gpus = sidecar.env.get("CUDA_VISIBLE_DEVICES")
        on_cuda = any(
            isinstance(m.engine, TorchEngine) and m.engine.device != "cpu"
            for m in spec.models_of(sidecar)
        )
        if sidecar.disaggregation is not None and gpus is not None and on_cuda:
            by_gpus.setdefault(gpus, []).append(sidecar)
    for gpus, sidecars in by_gpus.items():
        unsized = [
            s.name
            for s in sidecars
            if s.disaggregation is not None
            and s.disaggregation.max_tokens_in_paged_kv_cache is None
            and s.disaggregation.kv_cache_free_gpu_mem_fraction is None
        ]
        if len(sidecars) > 1 and unsized:
            raise SpecError(
                f"sidecars {sorted(s.name for s in sidecars)} share CUDA_VISIBLE_DEVICES {gpus}: "
                f"give {sorted(unsized)} disaggregation.max_tokens_in_paged_kv_cache (or "
                "kv_cache_free_gpu_mem_fraction), each sidecar's share of the memory"
            )
