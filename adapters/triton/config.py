"""Discovery of a deployed model's inputs and options from its Triton model configuration."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

_TRUE = frozenset({"true", "1", "yes", "on"})
_ENGINE_STEP_INPUTS = frozenset({"input_ids", "request_output_len"})
# TensorRT-LLM's stock BLS declares `temperature` but passes it on to its engine only from v0.13
# on (tensorrtllm_backend #578), the release that also added the `prompt_table_extra_id` input;
# v0.8 to v0.12 drop it. Every other input the gateway sends reaches the engine in v0.8, v0.11
# and v0.19 alike, through the ensembles and through the BLS.
_STOCK_BLS_FORWARDS_TEMPERATURE_SINCE = "prompt_table_extra_id"
_STOCK_BLS_BEFORE_V0_13_DROPS = frozenset({"temperature"})
# Per-request KV reuse stats: v0.16 to v0.18 have a flag of their own, v0.19 the perf metrics.
_REUSE_STATS_INPUTS = ("return_perf_metrics", "return_kv_cache_reuse_stats")
REUSED_BLOCKS = "kv_cache_reused_blocks"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One declared input: its wire datatype (``INT32``, ``BYTES``...) and dims without batch."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """What a deployed entry model accepts and how it behaves, as far as the gateway cares."""

    name: str
    platform: str
    """``ensemble`` for an ensemble, otherwise the backend (``python``, ``tensorrtllm``)."""
    inputs: Mapping[str, TensorSpec] = field(default_factory=dict)
    outputs: frozenset[str] = frozenset()
    max_batch_size: int = 0
    decoupled: bool = False
    """For an ensemble: whether its engine step is decoupled (resolved by the client)."""
    accumulate_tokens: bool = False
    """BLS only: streamed ``text_output`` is the cumulative text, not a delta."""
    engine_model: str | None = None
    """The ``tensorrt_llm`` model behind it: the ensemble's engine step or the BLS parameter."""
    guided_decoding: bool = False
    """Whether the engine behind the model has guided decoding on (``guided_decoding_backend``
    set, and for the C++ backend ``xgrammar_tokenizer_info_path`` too)."""
    stops_abandoned: bool = True
    """Whether an abandoned request can be stopped: an ensemble (a stop request to its engine
    step), the engine itself, or a BLS that forwards cancellation. The stock BLS cannot."""
    dropped: frozenset[str] = frozenset()
    """Inputs the model declares but never passes on to its engine (the stock BLS before
    TensorRT-LLM v0.13 drops ``temperature``): sending them changes nothing."""
    tokens_per_block: int | None = None
    """The engine's KV-cache block size (its ``tokens_per_block`` parameter), when known."""
    max_beam_width: int | None = None
    """The engine's widest beam search (its ``max_beam_width`` parameter), when known."""
    reuses_kv_cache: bool = True
    """Whether the engine may reuse cached prompt blocks: only an explicit
    ``enable_kv_cache_reuse`` of false says it does not."""
    priority_levels: int = 0
    """Triton's dynamic batcher's ``priority_levels``: 0 where the model has none, and a
    request's priority would reach no scheduler that reads it (TensorRT-LLM's executor
    schedules on its own)."""

    accepted: frozenset[str] = field(init=False)
    """The inputs the model declares and passes on to its engine (not ``dropped``)."""
    is_ensemble: bool = field(init=False)
    """Whether Triton schedules this model as an ensemble of steps."""
    is_engine: bool = field(init=False)
    """Whether this is the ``tensorrt_llm`` model itself: token ids in and out."""
    stream_input: str = field(init=False)
    """The input that turns streaming on: ``streaming`` on the engine, else ``stream``."""
    reports_output_tokens: bool = field(init=False)
    """Whether the model can return ``num_output_tokens`` when asked."""
    reports_input_tokens: bool = field(init=False)
    """Whether the model can return ``num_input_tokens`` when asked."""
    supports_logprobs: bool = field(init=False)
    """Whether per-token log probabilities can be requested and returned."""
    counts_by_logprobs: bool = field(init=False)
    """Without token-count outputs, the log probs (one per token) count tokens exactly."""
    accepts_guides: bool = field(init=False)
    """Whether guided-decoding inputs can be sent and the engine will honour them."""
    reuse_stats_input: str | None = field(init=False)
    """The flag that asks for per-request KV reuse stats, where the model returns them."""
    reports_cached_tokens: bool = field(init=False)
    """Whether the engine's reused blocks can be asked for and turned into prompt tokens."""
    salts_kv_cache: bool = field(init=False)
    """Whether requests can carry TensorRT-LLM's ``cache_salt_id``: KV blocks are then shared
    only between requests of the same salt."""
    lora_config_columns: int | None = field(init=False)
    """Columns of a ``lora_config`` row (3, or 4 with DoRA); ``None`` without LoRA."""

    def __post_init__(self) -> None:
        """Derive what requests ask of the model once, when it is described (and again for a
        copy with its engine's options), so a request reads ready values."""
        accepted = frozenset(self.inputs) - self.dropped
        outputs = self.outputs
        is_engine = "input_ids" in self.inputs and self.engine_model == self.name
        reports_output_tokens = (
            "return_num_output_tokens" in accepted and "num_output_tokens" in outputs
        )
        supports_logprobs = "return_log_probs" in accepted and "output_log_probs" in outputs
        reuse_stats_input = None
        if REUSED_BLOCKS in outputs:
            reuse_stats_input = next((n for n in _REUSE_STATS_INPUTS if n in accepted), None)
        lora = self.inputs.get("lora_config")
        derived = {
            "accepted": accepted,
            "is_ensemble": self.platform == "ensemble",
            "is_engine": is_engine,
            "stream_input": "streaming" if is_engine else "stream",
            "reports_output_tokens": reports_output_tokens,
            "reports_input_tokens": (
                "return_num_input_tokens" in accepted and "num_input_tokens" in outputs
            ),
            "supports_logprobs": supports_logprobs,
            "counts_by_logprobs": not reports_output_tokens and supports_logprobs,
            "accepts_guides": self.guided_decoding
            and {"guided_decoding_guide_type", "guided_decoding_guide"} <= accepted,
            "reuse_stats_input": reuse_stats_input,
            "reports_cached_tokens": (
                self.tokens_per_block is not None and reuse_stats_input is not None
            ),
            "salts_kv_cache": "cache_salt_id" in accepted,
            "lora_config_columns": (
                lora.dims[-1] if lora is not None and lora.dims and lora.dims[-1] > 0 else None
            ),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def drops(self, *names: str) -> str | None:
        """The first of ``names`` the model declares but does not pass on, if any."""
        return next((name for name in names if name in self.dropped), None)


def parse_model_config(document: Mapping[str, Any]) -> ModelInputs:
    """Read a model configuration as JSON (``get_model_config(as_json=True)`` or HTTP)."""
    config: Mapping[str, Any] = document.get("config", document)
    platform = str(config.get("platform") or config.get("backend") or "")
    parameters = _parameters(config.get("parameters", {}))
    policy = config.get("model_transaction_policy", {})
    inputs = {spec.name: spec for spec in map(_tensor_spec, config.get("input", ()))}
    stops_abandoned = True
    dropped: frozenset[str] = frozenset()
    if platform == "ensemble":
        engine_model = _engine_step(config.get("ensemble_scheduling", {}).get("step", ()))
    elif "input_ids" in inputs:
        engine_model = str(config.get("name", "")) or None
    else:
        # A BLS: the stock one calls the engine `tensorrt_llm` unless told otherwise.
        engine_model = parameters.get("tensorrt_llm_model_name", "tensorrt_llm")
        stops_abandoned = _truthy(parameters.get("forwards_cancellation", ""))
        if not _truthy(parameters.get("forwards_declared_inputs", "")):
            dropped = _stock_bls_drops(inputs)
    return ModelInputs(
        name=str(config.get("name", "")),
        platform=platform,
        inputs=inputs,
        outputs=frozenset(str(output["name"]) for output in config.get("output", ())),
        max_batch_size=int(config.get("max_batch_size", 0)),
        decoupled=_truthy(policy.get("decoupled", False)),
        accumulate_tokens=_truthy(parameters.get("accumulate_tokens", "")),
        engine_model=engine_model,
        guided_decoding=_guided_decoding(platform, parameters),
        stops_abandoned=stops_abandoned,
        dropped=dropped,
        tokens_per_block=_positive_int(parameters.get("tokens_per_block")),
        max_beam_width=_positive_int(parameters.get("max_beam_width")),
        reuses_kv_cache=parameters.get("enable_kv_cache_reuse", "true").lower() in _TRUE,
        priority_levels=int(config.get("dynamic_batching", {}).get("priority_levels", 0) or 0),
    )


def _positive_int(value: str | None) -> int | None:
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    return number if number is not None and number > 0 else None


def _stock_bls_drops(inputs: Mapping[str, TensorSpec]) -> frozenset[str]:
    """What a stock BLS declares and drops, told apart by the inputs of its release."""
    if _STOCK_BLS_FORWARDS_TEMPERATURE_SINCE in inputs:
        return frozenset()
    return _STOCK_BLS_BEFORE_V0_13_DROPS & inputs.keys()


def _guided_decoding(platform: str, parameters: Mapping[str, str]) -> bool:
    """An engine's guided decoding: the C++ backend needs the tokenizer info file as well."""
    if parameters.get("guided_decoding_backend") != "xgrammar":
        return False
    return platform != "tensorrtllm" or "xgrammar_tokenizer_info_path" in parameters


def wire_datatype(config_type: str) -> str:
    """Map a config ``data_type`` (``TYPE_STRING``, ``TYPE_FP16``) to the wire name."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _tensor_spec(entry: Mapping[str, Any]) -> TensorSpec:
    return TensorSpec(
        name=str(entry["name"]),
        datatype=wire_datatype(str(entry.get("data_type", "TYPE_INVALID"))),
        dims=tuple(int(dim) for dim in entry.get("dims", ())),
        optional=bool(entry.get("optional", False)),
    )


def _parameters(raw: Mapping[str, Any]) -> dict[str, str]:
    """String parameters that are set: unfilled ``${...}`` placeholders count as unset."""
    values: dict[str, str] = {}
    for key, value in raw.items():
        text = str(value.get("string_value", "")) if isinstance(value, Mapping) else str(value)
        if text and not text.startswith("${"):
            values[str(key)] = text
    return values


def _engine_step(steps: Iterable[Mapping[str, Any]]) -> str | None:
    for step in steps:
        if _ENGINE_STEP_INPUTS & set(step.get("input_map", {})):
            return str(step["model_name"])
    return None


def _truthy(value: object) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in _TRUE
