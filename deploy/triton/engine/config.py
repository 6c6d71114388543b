"""Settings of the engine's Triton model, read from the parameters of its config.pbtxt."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deploy.triton.engine.types import GUIDED_BACKEND as BACKEND
from deploy.triton.engine.types import EngineConfig, EngineError, GuidedConfig, KvCacheConfig
from deploy.triton.loadtest.paced import PacedConfig
from deploy.triton.params import flag, parameter


@dataclass(frozen=True)
class ModelParameters:
    """Engine configuration plus the Triton-side behaviour of the model."""

    engine: EngineConfig | PacedConfig
    """The torch engine's, or the paced load-test engine's (``load_test_model: true``)."""
    exclude_input_in_output: bool = False
    cancellation_check_period_ms: int = 100
    stats_check_period_ms: int = 100


def _int(model_config: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = parameter(model_config, key)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise EngineError(f"parameter {key} must be an integer, got {value!r}") from exc


def _bool(model_config: Mapping[str, Any], key: str, default: bool) -> bool:
    try:
        return flag(parameter(model_config, key), default=default, name=key)
    except ValueError as exc:
        raise EngineError(str(exc)) from exc


def _guided(model_config: Mapping[str, Any]) -> GuidedConfig | None:
    """Guided decoding is on with ``guided_decoding_backend: xgrammar``; the grammar's tokenizer
    is the tokenizer info file (as the C++ backend reads it), else ``tokenizer_dir`` (as the
    Python backend reads it), else the model's own tokenizer. ``guided_decoding_*`` parameters
    bound the compiles beside the engine (``GuidedConfig``)."""
    backend = parameter(model_config, "guided_decoding_backend")
    if backend is None:
        return None
    if backend != BACKEND:
        raise EngineError(f"parameter guided_decoding_backend must be {BACKEND}, got {backend!r}")
    return GuidedConfig(
        tokenizer_info_path=parameter(model_config, "xgrammar_tokenizer_info_path"),
        tokenizer_dir=parameter(model_config, "tokenizer_dir"),
        compile_timeout_ms=_positive(
            model_config, "guided_decoding_compile_timeout_ms", GuidedConfig.compile_timeout_ms
        ),
        max_compiles=_positive(
            model_config, "guided_decoding_max_compiles", GuidedConfig.max_compiles
        ),
        cache_mb=_positive(model_config, "guided_decoding_cache_mb", GuidedConfig.cache_mb),
    )


def settings_from_model_config(model_config: Mapping[str, Any]) -> ModelParameters:
    """Read `gpt_model_path`, `torch_*`, `max_beam_width` and the Triton-side parameters; or
    the `loadtest_*` parameters with `load_test_model: true`."""
    if _bool(model_config, "load_test_model", False):
        engine: EngineConfig | PacedConfig = _paced(model_config)
    else:
        engine = _torch(model_config)
    period = _int(model_config, "cancellation_check_period_ms", 100) or 100
    stats_period = _int(model_config, "stats_check_period_ms", 100) or 100
    return ModelParameters(
        engine=engine,
        exclude_input_in_output=_bool(model_config, "exclude_input_in_output", False),
        cancellation_check_period_ms=max(1, period),
        stats_check_period_ms=max(1, stats_period),
    )


def _torch(model_config: Mapping[str, Any]) -> EngineConfig:
    model_path = parameter(model_config, "gpt_model_path")
    if model_path is None:
        raise EngineError("parameter gpt_model_path (a Hugging Face model folder or id) is unset")
    beam_width = _int(model_config, "max_beam_width", 1)
    if beam_width is None or beam_width < 1:
        raise EngineError(f"parameter max_beam_width must be at least 1, got {beam_width}")
    max_batch_size = _int(model_config, "torch_max_batch_size", 16)
    if max_batch_size is None or max_batch_size < 1:
        raise EngineError("parameter torch_max_batch_size must be at least 1")
    return EngineConfig(
        model_path=model_path,
        device=parameter(model_config, "torch_device") or "auto",
        dtype=parameter(model_config, "torch_dtype") or "auto",
        max_batch_size=max_batch_size,
        max_seq_len=_int(model_config, "torch_max_seq_len", None),
        num_threads=_int(model_config, "torch_num_threads", None),
        lora_cache_size=max(1, _int(model_config, "torch_lora_cache_size", 8) or 8),
        guided=_guided(model_config),
        kv_cache=_kv_cache(model_config),
        enable_chunked_context=_bool(model_config, "enable_chunked_context", False),
        max_num_tokens=_positive(model_config, "max_num_tokens", EngineConfig.max_num_tokens),
        iter_stats_max_iterations=_positive(
            model_config, "iter_stats_max_iterations", EngineConfig.iter_stats_max_iterations
        ),
        max_beam_width=beam_width,
        mixed_batching=_bool(model_config, "torch_mixed_batching", True),
        kv_transfer_timeout_ms=_positive(
            model_config, "kv_transfer_timeout_ms", EngineConfig.kv_transfer_timeout_ms
        ),
    )


def _kv_cache(model_config: Mapping[str, Any]) -> KvCacheConfig:
    """The C++ backend's KV-cache parameters (``enable_kv_cache_reuse`` defaults to true there
    too), and the block size the torch engine pages its cache in."""
    fraction = _float(model_config, "kv_cache_free_gpu_mem_fraction", 0.9)
    if not 0.0 < fraction <= 1.0:
        raise EngineError(
            f"parameter kv_cache_free_gpu_mem_fraction must be in (0, 1], got {fraction}"
        )
    max_tokens = _int(model_config, "max_tokens_in_paged_kv_cache", None)
    if max_tokens is not None and max_tokens < 1:
        raise EngineError("parameter max_tokens_in_paged_kv_cache must be at least 1")
    return KvCacheConfig(
        tokens_per_block=_positive(
            model_config, "tokens_per_block", KvCacheConfig.tokens_per_block
        ),
        enable_reuse=_bool(model_config, "enable_kv_cache_reuse", True),
        free_gpu_mem_fraction=fraction,
        max_tokens=max_tokens,
    )


def _positive(model_config: Mapping[str, Any], key: str, default: int) -> int:
    value = _int(model_config, key, default)
    if value is None or value < 1:
        raise EngineError(f"parameter {key} must be at least 1, got {value}")
    return value


def _paced(model_config: Mapping[str, Any]) -> PacedConfig:
    values = {
        "token_s": _float(model_config, "loadtest_token_s", 0.0),
        "prompt_token_s": _float(model_config, "loadtest_prompt_token_s", 0.0),
    }
    if min(values.values()) < 0:
        raise EngineError("parameters loadtest_token_s and loadtest_prompt_token_s must be >= 0")
    batch = _int(model_config, "loadtest_max_batch_size", PacedConfig.max_batch_size)
    senders = _int(model_config, "loadtest_senders", PacedConfig.senders)
    return PacedConfig(
        token_id=_int(model_config, "loadtest_token_id", None),
        max_batch_size=max(1, batch or 1),
        senders=max(1, senders or 1),
        **values,
    )


def _float(model_config: Mapping[str, Any], key: str, default: float) -> float:
    value = parameter(model_config, key)
    if value is None:
        return default
    try:
        return float(value)
    except ValueError as exc:
        raise EngineError(f"parameter {key} must be a number, got {value!r}") from exc


def is_first_instance(model_config: Mapping[str, Any], instance_name: str, device_id: str) -> bool:
    """Whether this is the model's first instance, the one that publishes the engine's metrics.

    Triton 2.51 keeps one family per metric name for the whole server, so a second instance's
    families are the first one's, and unloading either frees the metrics of the other: the
    server then aborts at its next unload (heap corruption) and waits out its exit timeout. The
    first instance is the first of the first ``instance_group`` (Triton names it after the
    group, ``<group name>_0``), on that group's first GPU where it lists GPUs (each GPU's
    instances share the names). With several instances the metrics, the replica router's load
    signals among them, are those of the first instance's engine alone.
    """
    groups = model_config.get("instance_group") or []
    if not groups or not instance_name:
        return True
    first = groups[0]
    name = first.get("name") or f"{model_config.get('name', '')}_0"
    gpus = first.get("gpus") or []
    return instance_name == f"{name}_0" and (not gpus or str(gpus[0]) == device_id)
