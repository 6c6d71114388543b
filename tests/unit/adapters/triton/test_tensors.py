"""Request translation: neutral generation requests to the tensors each deployment declares."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from adapters.contract import GenerationRequest, InvalidRequest, PromptImage, SamplingParams
from adapters.triton.config import ModelInputs, parse_model_config
from adapters.triton.tensors import (
    build_inputs,
    requested_outputs,
    stop_request_inputs,
    streams,
)
from adapters.triton.wire import WireTensor
from tests.support.stock_configs import stock as stock_release
from tests.support.stock_configs import without_inputs
from tests.support.tensor_cases import by_name, request, stock


def with_token_counts(document: dict[str, Any]) -> dict[str, Any]:
    name = document["config"]["name"]
    decoupled = document["config"].get("model_transaction_policy", {}).get("decoupled", True)
    return stock_release(name, decoupled=decoupled)


ENSEMBLE = parse_model_config(stock("ensemble"))
BLS = parse_model_config(stock("tensorrt_llm_bls"))
COUNTING = parse_model_config(stock_release("tensorrt_llm_bls"))
OLD = parse_model_config(stock_release("ensemble", release="v0.19"))
OLDEST = parse_model_config(stock_release("ensemble", release="v0.11"))


def signature(tensors: list[WireTensor]) -> dict[str, tuple[str, tuple[int, ...], list[Any]]]:
    return {t.name: (t.datatype, t.array.shape, t.array.tolist()) for t in tensors}


def test_full_request_on_a_decoupled_bls_with_counts() -> None:
    model = parse_model_config(with_token_counts(stock("tensorrt_llm_bls")))
    tensors = build_inputs(
        request(
            stream=True,
            max_tokens=7,
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            seed=2**63 + 1,
            presence_penalty=0.25,
            frequency_penalty=-0.5,
            repetition_penalty=1.125,
            min_tokens=2,
            stop=("\n\n", "User:"),
            logprobs=True,
        ),
        model,
    )

    assert signature(tensors) == {
        "text_input": ("BYTES", (1, 1), [["Hello, wörld".encode()]]),
        "max_tokens": ("INT32", (1, 1), [[7]]),
        "temperature": ("FP32", (1, 1), [[0.5]]),
        "top_p": ("FP32", (1, 1), [[pytest.approx(0.9)]]),
        "top_k": ("INT32", (1, 1), [[40]]),
        "seed": ("UINT64", (1, 1), [[2**63 + 1]]),
        "presence_penalty": ("FP32", (1, 1), [[0.25]]),
        "frequency_penalty": ("FP32", (1, 1), [[-0.5]]),
        "repetition_penalty": ("FP32", (1, 1), [[1.125]]),
        "min_tokens": ("INT32", (1, 1), [[2]]),
        "stop_words": ("BYTES", (1, 2), [[b"\n\n", b"User:"]]),
        "return_log_probs": ("BOOL", (1, 1), [[True]]),
        "stream": ("BOOL", (1, 1), [[True]]),
        "return_num_input_tokens": ("BOOL", (1, 1), [[True]]),
        "return_num_output_tokens": ("BOOL", (1, 1), [[True]]),
    }
    dtypes = {t.name: t.array.dtype for t in tensors}
    assert dtypes["seed"] == np.uint64
    assert dtypes["temperature"] == np.float32
    assert dtypes["stream"] == np.bool_


def test_minimal_request_sends_only_required_inputs_and_flags() -> None:
    tensors = by_name(build_inputs(request(), COUNTING))

    assert set(tensors) == {
        "text_input",
        "max_tokens",
        "stream",
        "exclude_input_in_output",
        "return_num_input_tokens",
        "return_num_output_tokens",
    }
    assert tensors["stream"].array.tolist() == [[False]]


def test_only_a_request_answered_whole_asks_to_leave_its_prompt_out() -> None:
    """A streamed answer never carries the prompt, so the flag goes with whole answers only:
    a model that is not decoupled answers a streamed request whole."""
    whole = by_name(build_inputs(request(stream=False), COUNTING))
    streamed = by_name(build_inputs(request(stream=True), COUNTING))
    answered_whole = by_name(build_inputs(request(stream=True), ENSEMBLE))

    assert not ENSEMBLE.decoupled and COUNTING.decoupled
    assert whole["exclude_input_in_output"].array.tolist() == [[True]]
    assert streamed["stream"].array.tolist() == [[True]]
    assert "exclude_input_in_output" not in streamed
    assert answered_whole["stream"].array.tolist() == [[False]]
    assert answered_whole["exclude_input_in_output"].array.tolist() == [[True]]


def test_without_token_counts_log_probs_are_asked_for_to_count_tokens() -> None:
    tensors = by_name(build_inputs(request(), ENSEMBLE))

    assert set(tensors) == {
        "text_input",
        "max_tokens",
        "stream",
        "exclude_input_in_output",
        "return_log_probs",
    }
    assert requested_outputs(request(), ENSEMBLE) == ["text_output", "output_log_probs"]


@pytest.mark.parametrize(
    ("model", "min_name", "seed_name", "has_exclude"),
    [(ENSEMBLE, "min_tokens", "seed", True), (OLD, "min_length", "random_seed", True),
     (OLDEST, "min_length", "random_seed", False)],
    ids=["stock", "v0.19", "v0.15"],
)  # fmt: skip
def test_old_releases_get_their_own_names(
    model: ModelInputs, min_name: str, seed_name: str, has_exclude: bool
) -> None:
    tensors = by_name(build_inputs(request(seed=5, min_tokens=3), model))

    assert tensors[min_name].array.tolist() == [[3]]
    assert tensors[seed_name].datatype == "UINT64"
    assert tensors[seed_name].array.tolist() == [[5]]
    other_names = {"min_tokens", "min_length", "seed", "random_seed"} - {min_name, seed_name}
    assert not other_names & set(tensors)
    assert ("exclude_input_in_output" in tensors) is has_exclude
    assert "return_num_output_tokens" not in tensors


@pytest.mark.parametrize(
    ("stream", "decoupled", "expected"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
def test_streaming_needs_a_decoupled_model(stream: bool, decoupled: bool, expected: bool) -> None:
    model = parse_model_config(stock("tensorrt_llm_bls", decoupled=decoupled))

    assert streams(request(stream=stream), model) is expected
    assert by_name(build_inputs(request(stream=stream), model))["stream"].array.tolist() == [
        [expected]
    ]


@pytest.mark.parametrize(
    ("missing", "params", "param"),
    [
        ("top_k", {"top_k": 5}, "top_k"),
        ("temperature", {"temperature": 0.2}, "temperature"),
        ("stop_words", {"stop": ("x",)}, "stop"),
        ("return_log_probs", {"logprobs": True}, "logprobs"),
        ("repetition_penalty", {"repetition_penalty": 1.1}, "repetition_penalty"),
    ],
)
def test_explicit_parameter_the_model_lacks_is_rejected_by_name(
    missing: str, params: dict[str, Any], param: str
) -> None:
    model = parse_model_config(without_inputs(stock("tensorrt_llm_bls"), missing))

    with pytest.raises(InvalidRequest) as caught:
        build_inputs(request(**params), model)
    assert caught.value.param == param


NO_SEED = parse_model_config(without_inputs(stock("ensemble"), "seed"))


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"seed": 7, "seed_origin": "client"}, "seed"),
        ({"seed": 7, "seed_origin": "choices", "temperature": 0.8}, "n"),
    ],
)
def test_a_seed_that_must_be_honoured_needs_a_seed_input(
    params: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        build_inputs(request(**params), NO_SEED)
    assert caught.value.param == param


@pytest.mark.parametrize(
    "params",
    [
        {"seed": 7, "seed_origin": "variation"},
        {"seed": 7, "seed_origin": "choices", "temperature": 0.0},
        {"seed": 7, "seed_origin": "choices", "top_k": 1},
    ],
    ids=["unseeded", "greedy-choices", "top-k-1-choices"],
)
def test_a_gateway_chosen_seed_is_dropped_where_the_model_has_no_seed_input(
    params: dict[str, Any],
) -> None:
    tensors = by_name(build_inputs(request(**params), NO_SEED))
    assert "seed" not in tensors and "random_seed" not in tensors
    assert by_name(build_inputs(request(**params), ENSEMBLE))["seed"].array.tolist() == [[7]]


def test_unset_parameter_the_model_lacks_is_skipped() -> None:
    model = parse_model_config(without_inputs(stock("tensorrt_llm_bls"), "top_k", "stop_words"))

    assert "top_k" not in by_name(build_inputs(request(temperature=1.0), model))


def test_missing_min_tokens_under_both_names_is_rejected() -> None:
    model = parse_model_config(without_inputs(stock("ensemble"), "min_tokens"))

    with pytest.raises(InvalidRequest, match="min_tokens"):
        build_inputs(request(min_tokens=1), model)


@pytest.mark.parametrize(("field", "value"), [("seed", -1), ("seed", 2**64), ("top_k", 2**31)])
def test_integers_must_fit_the_declared_dtype(field: str, value: int) -> None:
    params: dict[str, Any] = {field: value}
    with pytest.raises(InvalidRequest) as caught:
        build_inputs(request(**params), ENSEMBLE)
    assert caught.value.param == field


def test_requested_outputs_follow_what_the_model_reports() -> None:
    assert requested_outputs(request(), COUNTING) == [
        "text_output",
        "num_input_tokens",
        "num_output_tokens",
    ]
    assert requested_outputs(request(logprobs=True), COUNTING) == [
        "text_output",
        "num_input_tokens",
        "num_output_tokens",
        "output_log_probs",
    ]


def test_a_prompt_the_gateway_counted_is_not_counted_again_by_the_engine() -> None:
    """Every streamed response would carry ``num_input_tokens``; a text prompt's count is the
    caller's, a prompt with images is still the engine's to count."""
    counted = dataclasses.replace(request(stream=True), prompt_tokens=5)
    with_image = dataclasses.replace(counted, images=(PromptImage(b"\x89PNG", "image/png"),))
    uncounted = request(stream=True)

    assert requested_outputs(counted, COUNTING) == ["text_output", "num_output_tokens"]
    flags = by_name(build_inputs(counted, COUNTING))
    assert "return_num_input_tokens" not in flags
    assert flags["return_num_output_tokens"].array.tolist() == [[True]]
    assert "num_input_tokens" in requested_outputs(with_image, COUNTING)
    assert "num_input_tokens" in requested_outputs(uncounted, COUNTING)
    assert "return_num_input_tokens" in by_name(build_inputs(uncounted, COUNTING))


def _block_size(document: dict[str, Any], tokens: int = 32) -> ModelInputs:
    from dataclasses import replace

    return replace(parse_model_config(document), tokens_per_block=tokens)


@pytest.mark.parametrize(
    ("model", "flag"),
    [
        (_block_size(stock_release("ensemble")), "return_perf_metrics"),
        (_block_size(stock_release("tensorrt_llm_bls", release="v0.19")), "return_perf_metrics"),
        (_block_size(stock_release("ensemble", release="v0.11")), None),  # no reuse stats
        (parse_model_config(stock_release("ensemble")), None),  # block size unknown
    ],
    ids=["latest-ensemble", "v0.19-bls", "v0.11", "no-block-size"],
)
def test_reuse_stats_are_asked_for_where_the_model_returns_them(
    model: ModelInputs, flag: str | None
) -> None:
    generation = GenerationRequest(
        request_id="r",
        prompt="Hi",
        params=SamplingParams(max_tokens=4),
        stream=False,
    )
    names = by_name(build_inputs(generation, model))
    outputs = requested_outputs(generation, model)
    if flag is None:
        assert "return_perf_metrics" not in names
        assert "kv_cache_reused_blocks" not in outputs
        return
    assert names[flag].array.tolist() == [[True]]
    assert "kv_cache_reused_blocks" in outputs


def test_stop_request_inputs() -> None:
    assert signature(stop_request_inputs()) == {
        "stop": ("BOOL", (1, 1), [[True]]),
        "input_ids": ("INT32", (1, 1), [[0]]),
        "input_lengths": ("INT32", (1, 1), [[0]]),
        "request_output_len": ("INT32", (1, 1), [[0]]),
    }


def test_raw_bytes_layout() -> None:
    words = WireTensor("stop_words", "BYTES", np.array([[b"ab", "é".encode()]], dtype=object))
    ints = WireTensor("max_tokens", "INT32", np.array([[258]], dtype=np.int32))

    assert words.raw_bytes() == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa9"
    assert ints.raw_bytes() == b"\x02\x01\x00\x00"


def test_unbatched_model_gets_no_batch_dim() -> None:
    document = stock("tensorrt_llm_bls")
    document["config"]["max_batch_size"] = 0
    tensors = by_name(build_inputs(request(stop=("a", "b")), parse_model_config(document)))

    assert tensors["text_input"].array.shape == (1,)
    assert tensors["stop_words"].array.shape == (2,)


def test_a_defaulted_field_the_model_lacks_is_left_out() -> None:
    model = parse_model_config(without_inputs(stock("ensemble"), "top_p"))
    defaulted = request(top_p=1.0, defaulted=frozenset({"top_p"}))
    assert "top_p" not in by_name(build_inputs(defaulted, model))
    with pytest.raises(InvalidRequest) as caught:
        build_inputs(request(top_p=0.5), model)
    assert caught.value.param == "top_p"


def _with_parameter(document: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    document["config"].setdefault("parameters", {})[key] = {"string_value": value}
    return document


STOCK_BLS = {
    release: parse_model_config(stock_release("tensorrt_llm_bls", release=release))
    for release in ("v0.8", "v0.11", "v0.19", "latest")
}
DROPS_TEMPERATURE = {"v0.8": True, "v0.11": True, "v0.19": False, "latest": False}
OUR_OLD_BLS = parse_model_config(
    _with_parameter(
        stock_release("tensorrt_llm_bls", release="v0.8"), "forwards_declared_inputs", "true"
    )
)


@pytest.mark.parametrize("release", list(STOCK_BLS))
def test_only_the_stock_bls_before_v0_13_drops_temperature(release: str) -> None:
    model = STOCK_BLS[release]

    assert "temperature" in model.inputs
    assert (model.drops("temperature") == "temperature") is DROPS_TEMPERATURE[release]
    assert not OUR_OLD_BLS.dropped


@pytest.mark.parametrize(
    ("model", "top_k_input"),
    [*((STOCK_BLS[r], "top_k") for r in STOCK_BLS), (ENSEMBLE, "top_k"), (OUR_OLD_BLS, "top_k")],
    ids=[*STOCK_BLS, "ensemble", "our-v0.8-bls"],
)  # fmt: skip
@pytest.mark.parametrize(
    "params",
    [{"temperature": 0.0, "top_p": 1.0}, {"temperature": 0.0, "top_k": 40},
     {"top_k": 1, "temperature": 0.7},
     {"temperature": 0.0, "top_k": 40, "defaulted": frozenset({"top_k"})}],
    ids=["temperature-0", "temperature-0-over-top-k", "top-k-1", "temperature-0-over-default"],
)  # fmt: skip
def test_greedy_requests_also_reach_the_engine_as_top_k_1(
    model: ModelInputs, top_k_input: str, params: dict[str, Any]
) -> None:
    tensors = by_name(build_inputs(request(**params), model))

    assert tensors[top_k_input].array.tolist() == [[1]]
    assert ("temperature" in tensors) is not bool(model.dropped)
    if "temperature" in tensors:
        assert tensors["temperature"].array.tolist() == [[pytest.approx(params["temperature"])]]


@pytest.mark.parametrize("release", ["v0.8", "v0.11"])
def test_a_temperature_the_stock_bls_drops_is_refused_by_name(release: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        build_inputs(request(temperature=0.7, top_p=0.9), STOCK_BLS[release])

    assert caught.value.param == "temperature"
    assert "does not pass it on to its engine" in caught.value.detail
    assert "is not supported by this model" in str(caught.value)
    assert "tensorrt_llm_bls" in caught.value.detail and "tensorrt_llm" not in str(caught.value)


@pytest.mark.parametrize("release", ["v0.8", "v0.11"])
@pytest.mark.parametrize(
    "params",
    [{"temperature": 1.0, "top_p": 0.9},
     {"temperature": 0.2, "top_p": 0.9, "defaulted": frozenset({"temperature"})}],
    ids=["engine-default", "gateway-default"],
)  # fmt: skip
def test_a_temperature_the_stock_bls_drops_is_left_out_where_that_changes_nothing(
    release: str, params: dict[str, Any]
) -> None:
    tensors = by_name(build_inputs(request(**params), STOCK_BLS[release]))

    assert "temperature" not in tensors
    assert "top_k" not in tensors
    assert tensors["top_p"].array.tolist() == [[pytest.approx(0.9)]]


def test_without_a_top_k_input_greedy_needs_the_temperature_to_arrive() -> None:
    model = parse_model_config(
        without_inputs(stock_release("tensorrt_llm_bls", release="v0.8"), "top_k")
    )

    with pytest.raises(InvalidRequest) as caught:
        build_inputs(request(temperature=0.0), model)
    assert caught.value.param == "temperature"
    assert "temperature" in by_name(build_inputs(request(temperature=0.0), ENSEMBLE))
