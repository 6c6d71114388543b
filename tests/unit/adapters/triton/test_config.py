"""Model-config discovery: input names, dtypes, dims and options across TensorRT-LLM releases."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from adapters.triton.config import ModelInputs, TensorSpec, parse_model_config, wire_datatype
from adapters.triton.tensors import first_input
from tests.support.stock_configs import stock, with_lora_columns, without_token_counts


@pytest.mark.parametrize("name", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize(
    ("release", "variant", "min_tokens", "seed", "exclude", "counts"),
    [
        ("latest", without_token_counts, "min_tokens", "seed", True, False),
        ("latest", lambda d: d, "min_tokens", "seed", True, True),
        ("v0.19", lambda d: d, "min_length", "random_seed", True, False),
        ("v0.11", lambda d: d, "min_length", "random_seed", False, False),
        ("v0.8", lambda d: d, "min_length", "random_seed", False, False),
    ],
    ids=["may-2025", "latest", "v0.19", "v0.11", "v0.8"],
)
def test_release_differences_are_discovered(
    name: str, release: str, variant: Any, min_tokens: str, seed: str, exclude: bool, counts: bool
) -> None:
    model = parse_model_config(variant(stock(name, release=release)))

    assert first_input(model, ("min_tokens", "min_length")) == TensorSpec(
        min_tokens, "INT32", (1,), optional=True
    )
    assert first_input(model, ("seed", "random_seed")) == TensorSpec(
        seed, "UINT64", (1,), optional=True
    )
    assert ("exclude_input_in_output" in model.accepted) is exclude
    assert model.reports_output_tokens is counts
    assert model.reports_input_tokens is counts


@pytest.mark.parametrize("name", ["ensemble", "tensorrt_llm_bls"])
def test_required_and_wire_types(name: str) -> None:
    model = parse_model_config(stock(name))

    assert model.inputs["text_input"] == TensorSpec("text_input", "BYTES", (1,))
    assert model.inputs["max_tokens"] == TensorSpec("max_tokens", "INT32", (1,))
    assert model.inputs["stop_words"] == TensorSpec("stop_words", "BYTES", (-1,), optional=True)
    assert model.inputs["lora_weights"].datatype == "FP16"
    assert model.max_batch_size == 4
    assert {"text_output", "output_log_probs"} <= model.outputs
    assert model.supports_logprobs


def test_ensemble_points_at_its_engine_step() -> None:
    model = parse_model_config(stock("ensemble"))

    assert model.is_ensemble
    assert model.platform == "ensemble"
    assert model.engine_model == "tensorrt_llm"
    assert model.decoupled is False, "an ensemble has no policy of its own"
    assert model.accumulate_tokens is False


@pytest.mark.parametrize(
    ("values", "decoupled", "accumulate", "engine"),
    [
        ({}, True, False, "tensorrt_llm"),
        ({"accumulate_tokens": "True", "tensorrt_llm_model_name": "tiny_tensorrt_llm"}, True, True,
         "tiny_tensorrt_llm"),
        ({"accumulate_tokens": "false", "decoupled_mode": "false"}, False, False, "tensorrt_llm"),
        ({"accumulate_tokens": "1"}, True, True, "tensorrt_llm"),
    ],
)  # fmt: skip
def test_bls_parameters(
    values: dict[str, Any], decoupled: bool, accumulate: bool, engine: str | None
) -> None:
    model = parse_model_config(stock("tensorrt_llm_bls", **values))

    assert not model.is_ensemble
    assert model.platform == "python"
    assert model.decoupled is decoupled
    assert model.accumulate_tokens is accumulate
    assert model.engine_model == engine


@pytest.mark.parametrize("release", ["v0.8", "v0.11", "v0.19", "latest"])
def test_only_the_stock_bls_cannot_stop_an_abandoned_request(release: str) -> None:
    stock_bls = parse_model_config(stock("tensorrt_llm_bls", release=release))
    assert stock_bls.stops_abandoned is False
    document = stock("tensorrt_llm_bls", release=release)
    document["config"]["parameters"]["forwards_cancellation"] = {"string_value": "true"}
    assert parse_model_config(document).stops_abandoned is True
    assert parse_model_config(stock("ensemble", release=release)).stops_abandoned is True
    engine = stock("tensorrt_llm", release=release, triton_backend="python")
    assert parse_model_config(engine).stops_abandoned is True


@pytest.mark.parametrize("decoupled", [True, False])
def test_engine_decoupled_mode(decoupled: bool) -> None:
    model = parse_model_config(stock("tensorrt_llm", decoupled=decoupled, triton_backend="python"))

    assert model.decoupled is decoupled
    assert model.platform == "python"
    assert "stop" in model.accepted
    assert model.inputs["input_lengths"] == TensorSpec("input_lengths", "INT32", (1,))


@pytest.mark.parametrize(
    ("columns", "dtype", "expected_dtype"),
    [(3, "TYPE_FP16", "FP16"), (4, "TYPE_FP16", "FP16"), (4, "TYPE_BF16", "BF16")],
)
def test_lora_layout(columns: int, dtype: str, expected_dtype: str) -> None:
    model = parse_model_config(with_lora_columns(stock("tensorrt_llm_bls"), columns, dtype))

    assert model.lora_config_columns == columns
    assert model.inputs["lora_weights"].datatype == expected_dtype


def test_http_json_form_parses_the_same() -> None:
    """``GET /v2/models/<m>/config`` returns the config unwrapped with integer dims."""
    document = stock("tensorrt_llm_bls")["config"]
    inputs = [{**entry, "dims": [int(d) for d in entry["dims"]]} for entry in document["input"]]
    http = {**document, "input": inputs}

    assert parse_model_config(http) == parse_model_config({"config": document})


def test_model_without_lora_or_optional_outputs() -> None:
    model = parse_model_config(
        {"config": {"name": "m", "backend": "python", "input": [], "output": []}}
    )

    assert model == ModelInputs(
        name="m", platform="python", engine_model="tensorrt_llm", stops_abandoned=False
    )
    assert model.lora_config_columns is None
    assert not model.reports_output_tokens
    assert not model.supports_logprobs


@pytest.mark.parametrize(
    ("config_type", "wire"),
    [("TYPE_STRING", "BYTES"), ("TYPE_BOOL", "BOOL"), ("TYPE_UINT64", "UINT64"),
     ("TYPE_BF16", "BF16"), ("TYPE_FP32", "FP32")],
)  # fmt: skip
def test_wire_datatype(config_type: str, wire: str) -> None:
    assert wire_datatype(config_type) == wire


@pytest.mark.parametrize(
    ("value", "expected"),
    [("16", 16), ("64", 64), ("0", None), ("many", None), ("${tokens_per_block}", None)],
)
def test_the_engines_block_size_is_read_from_its_parameters(
    value: str, expected: int | None
) -> None:
    document = stock("tensorrt_llm", release="v0.19")
    document["config"].setdefault("parameters", {})["tokens_per_block"] = {"string_value": value}
    model = parse_model_config(document)
    assert model.tokens_per_block == expected
    assert model.reuse_stats_input == "return_perf_metrics"
    assert model.reports_cached_tokens is (expected is not None)


def _renamed_perf_flag(document: dict[str, Any]) -> dict[str, Any]:
    """A v0.16 to v0.18 layout: the reuse stats asked for by ``return_kv_cache_reuse_stats``."""
    for tensor in document["config"]["input"]:
        if tensor["name"] == "return_perf_metrics":
            tensor["name"] = "return_kv_cache_reuse_stats"
    return document


@pytest.mark.parametrize(
    ("document", "flag"),
    [
        (stock("tensorrt_llm", release="v0.19"), "return_perf_metrics"),
        (_renamed_perf_flag(stock("tensorrt_llm", release="v0.19")), "return_kv_cache_reuse_stats"),
        (stock("tensorrt_llm", release="v0.11"), None),
    ],
    ids=["v0.19", "v0.16-v0.18", "v0.11"],
)
def test_the_reuse_stats_flag_of_each_release(document: dict[str, Any], flag: str | None) -> None:
    assert parse_model_config(document).reuse_stats_input == flag


def test_what_a_request_reads_follows_the_options_its_engine_adds() -> None:
    """An ensemble's own config says neither its engine's block size nor its guided decoding:
    the copy holding its engine's options answers from them."""
    model = parse_model_config(stock("ensemble"))
    assert model.reuse_stats_input == "return_perf_metrics"
    assert not model.reports_cached_tokens and not model.accepts_guides

    engine = replace(model, tokens_per_block=32, guided_decoding=True)
    assert engine.reports_cached_tokens and engine.accepts_guides
