"""Pure translation between Triton tensors and engine types, and the model's config parameters."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from deploy.triton.engine.config import settings_from_model_config
from deploy.triton.engine.types import (
    EngineBeamSearch,
    EngineConfig,
    EngineError,
    SamplingConfig,
)
from deploy.triton.engine.wire import (
    LOOKAHEAD_ERROR,
    is_stop_request,
    parse_items,
    parse_word_list,
)


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ([[0], [-1]], ()),
        ([[5, 6, 7], [1, 3, -1]], ((5,), (6, 7))),
        ([[5, 6, 7, 0], [3, -1, -1, -1]], ((5, 6, 7),)),
    ],
)
def test_parse_word_list(table: list[list[int]], words: tuple[tuple[int, ...], ...]) -> None:
    assert parse_word_list(np.array([table], dtype=np.int32)[0]) == words


def test_parse_word_list_rejects_offsets_beyond_the_ids() -> None:
    with pytest.raises(EngineError):
        parse_word_list(np.array([[5, 6], [3, -1]], dtype=np.int32))


def _inputs(**extra: Any) -> dict[str, npt.NDArray[Any]]:
    base: dict[str, npt.NDArray[Any]] = {
        "input_ids": np.array([[5, 6, 7]], np.int32),
        "input_lengths": np.array([[3]], np.int32),
        "request_output_len": np.array([[4]], np.int32),
    }
    return base | {k: np.asarray(v) for k, v in extra.items()}


def test_parse_items_defaults_and_old_input_names() -> None:
    items = parse_items(
        _inputs(
            random_seed=np.array([[9]], np.uint64),
            min_length=np.array([[3]], np.int32),
            runtime_top_p=np.array([[0.0]], np.float32),
            end_id=np.array([[-1]], np.int32),
        ),
        id_prefix="k",
        exclude_input_default=True,
    )
    request, context = items[0]
    assert request.request_id == "k/0"
    assert request.input_ids == (5, 6, 7)
    assert request.sampling == SamplingConfig(seed=9, min_tokens=3)
    assert request.end_ids == ()
    assert context.exclude_input is True
    assert context.streaming is False


def test_parse_items_splits_a_batch_by_input_lengths() -> None:
    inputs = {
        "input_ids": np.array([[5, 6, 7], [8, 9, 0]], np.int32),
        "input_lengths": np.array([[3], [2]], np.int32),
        "request_output_len": np.array([[4], [2]], np.int32),
        "temperature": np.array([[0.5], [0.0]], np.float32),
        "stop_words_list": np.array([[[1, 2], [2, -1]], [[3, 0], [1, -1]]], np.int32),
    }
    (first, ctx0), (second, ctx1) = parse_items(inputs, id_prefix="x", exclude_input_default=False)
    assert (first.input_ids, second.input_ids) == ((5, 6, 7), (8, 9))
    assert (first.max_new_tokens, second.max_new_tokens) == (4, 2)
    assert (first.sampling.temperature, second.sampling.temperature) == (0.5, 0.0)
    assert (first.stop_words, second.stop_words) == (((1, 2),), ((3,),))
    assert (ctx0.batch_index, ctx1.batch_index) == (0, 1)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"lora_weights": np.ones((1, 2, 4), np.float16)}, "lora_task_id must be set"),
        (
            {
                "lora_task_id": np.array([[3]], np.uint64),
                "lora_config": np.ones((1, 2, 3), np.int32),
            },
            "must have both lora_weights and lora_keys",
        ),
        ({"beam_width": np.array([[0]], np.int32)}, "beam_width must be at least 1"),
        ({"draft_input_ids": np.array([[1, 2]], np.int32)}, "speculative decoding"),
        ({"decoder_input_ids": np.array([[4, 5]], np.int32)}, "decoder_input_ids holds 2"),
        ({"encoder_input_features": np.ones((1, 2, 3), np.float16)}, "encoder-decoder"),
        ({"lookahead_window_size": np.array([[4]], np.int32)}, re.escape(LOOKAHEAD_ERROR)),
        ({"request_output_len": np.zeros((1, 0), np.int32)}, "request_output_len is required"),
        ({"input_lengths": np.array([[9]], np.int32)}, "does not fit"),
    ],
)
def test_parse_items_rejects_what_the_engine_cannot_do(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(EngineError, match=message):
        parse_items(_inputs(**extra), id_prefix="k", exclude_input_default=False)


def test_parse_items_reads_each_items_lora_tensors() -> None:
    weights = np.arange(2 * 3 * 8, dtype=np.float16).reshape(2, 3, 8)
    config = np.ones((2, 3, 3), np.int32)
    inputs = {
        "input_ids": np.array([[5, 6], [8, 9]], np.int32),
        "input_lengths": np.array([[2], [2]], np.int32),
        "request_output_len": np.array([[4], [2]], np.int32),
        "lora_task_id": np.array([[11], [12]], np.uint64),
        "lora_weights": weights,
        "lora_config": config,
    }
    (first, _), (second, _) = parse_items(inputs, id_prefix="x", exclude_input_default=False)
    assert first.lora is not None and second.lora is not None
    assert (first.lora.task_id, second.lora.task_id) == (11, 12)
    assert first.lora.weights is not None and second.lora.weights is not None
    assert np.array_equal(second.lora.weights, weights[1])
    only_id = parse_items(
        _inputs(lora_task_id=np.array([[7]], np.uint64)), id_prefix="y", exclude_input_default=False
    )[0][0]
    assert only_id.lora is not None and only_id.lora.weights is None


def test_parse_items_accepts_beam_width_one_and_empty_embedding_bias() -> None:
    items = parse_items(
        _inputs(beam_width=np.array([[1]], np.int32), embedding_bias=np.zeros((1, 0), np.float32)),
        id_prefix="k",
        exclude_input_default=False,
    )
    assert items[0][0].embedding_bias is None


def test_parse_items_ignores_the_placeholder_decoder_input_of_stock_preprocessing() -> None:
    """The stock preprocessing always sends `[[pad_id]]`; a decoder-only engine ignores it."""
    placeholder = {
        "decoder_input_ids": np.array([[0]], np.int32),
        "decoder_input_lengths": np.array([[1]], np.int32),
    }
    ((request, _),) = parse_items(
        _inputs(**placeholder), id_prefix="k", exclude_input_default=False
    )
    assert request.input_ids == (5, 6, 7)
    padded = {
        "decoder_input_ids": np.array([[0, 0, 0]], np.int32),
        "decoder_input_lengths": np.array([[1]], np.int32),
    }
    parse_items(_inputs(**padded), id_prefix="k", exclude_input_default=False)


def test_parse_items_reads_logits_perf_and_top_p_decay_flags() -> None:
    ((request, context),) = parse_items(
        _inputs(
            return_context_logits=np.array([[True]]),
            return_generation_logits=np.array([[True]]),
            return_kv_cache_reuse_stats=np.array([[True]]),
            runtime_top_p=np.array([[0.9]], np.float32),
            runtime_top_p_decay=np.array([[0.5]], np.float32),
            runtime_top_p_reset_ids=np.array([[7]], np.int32),
            runtime_top_p_min=np.array([[0.3]], np.float32),
        ),
        id_prefix="k",
        exclude_input_default=False,
        vocab_size=11,
    )
    assert request.return_context_logits and request.return_generation_logits
    assert context.return_perf_metrics and context.vocab_size == 11
    assert context.max_new_tokens == 4 and context.batch_size == 1
    assert request.sampling.top_p_decay == 0.5
    assert request.sampling.top_p_reset_id == 7
    assert request.sampling.decays
    assert request.arrival_ns > 0


def test_is_stop_request() -> None:
    assert is_stop_request(_inputs(stop=np.array([[True]])))
    assert not is_stop_request(_inputs(stop=np.array([[False]])))
    assert not is_stop_request(_inputs())


def _config(**parameters: str) -> dict[str, Any]:
    return {"parameters": {k: {"string_value": v} for k, v in parameters.items()}}


def test_settings_read_parameters_and_treat_placeholders_as_unset() -> None:
    settings = settings_from_model_config(
        _config(
            gpt_model_path="/models/tiny",
            torch_device="cuda:1",
            torch_max_batch_size="4",
            torch_max_seq_len="${torch_max_seq_len}",
            exclude_input_in_output="true",
            cancellation_check_period_ms="20",
        )
    )
    assert settings.engine.model_path == "/models/tiny"
    assert settings.engine.device == "cuda:1"
    assert settings.engine.dtype == "auto"
    assert settings.engine.max_batch_size == 4
    assert settings.engine.max_seq_len is None
    assert settings.exclude_input_in_output is True
    assert settings.cancellation_check_period_ms == 20


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        # Unset or still a placeholder: the C++ backend's defaults (reuse on, no chunking).
        ({}, (32, True, 0.9, None, False, 8192)),
        (
            {"enable_kv_cache_reuse": "${enable_kv_cache_reuse}", "max_num_tokens": "${x}"},
            (32, True, 0.9, None, False, 8192),
        ),
        # What the stock v0.8 and v0.11 examples fill in (docs/llama.md).
        (
            {
                "enable_kv_cache_reuse": "False",
                "max_tokens_in_paged_kv_cache": "2560",
                "kv_cache_free_gpu_mem_fraction": "0.5",
            },
            (32, False, 0.5, 2560, False, 8192),
        ),
        (
            {"tokens_per_block": "16", "enable_chunked_context": "true", "max_num_tokens": "64"},
            (16, True, 0.9, None, True, 64),
        ),
    ],
)
def test_settings_read_the_kv_cache_and_scheduler_parameters(
    parameters: dict[str, str], expected: tuple[object, ...]
) -> None:
    engine = settings_from_model_config(_config(gpt_model_path="m", **parameters)).engine
    assert isinstance(engine, EngineConfig)
    kv = engine.kv_cache
    got = (
        kv.tokens_per_block,
        kv.enable_reuse,
        kv.free_gpu_mem_fraction,
        kv.max_tokens,
        engine.enable_chunked_context,
        engine.max_num_tokens,
    )
    assert got == expected


def test_prompt_table_extra_ids_salt_the_prompt() -> None:
    inputs = _inputs(prompt_table_extra_ids=np.array([[0, 7, 7, 0]], np.uint64))
    ((request, _),) = parse_items(inputs, id_prefix="k", exclude_input_default=False)
    assert request.extra_ids == (0, 7, 7)
    plain = _inputs(prompt_table_extra_ids=np.zeros((1, 3), np.uint64))
    assert parse_items(plain, id_prefix="k", exclude_input_default=False)[0][0].extra_ids is None
    short = _inputs(prompt_table_extra_ids=np.array([[1]], np.uint64))
    with pytest.raises(EngineError, match="prompt_table_extra_ids holds 1 ids"):
        parse_items(short, id_prefix="k", exclude_input_default=False)


@pytest.mark.parametrize(
    ("extra", "beam"),
    [
        ({}, None),
        ({"beam_width": np.array([[1]], np.int32)}, None),
        ({"beam_width": np.array([[3]], np.int32)}, EngineBeamSearch(3)),
        (
            {
                "beam_width": np.array([[2]], np.int32),
                "len_penalty": np.array([[0.5]], np.float32),
                "early_stopping": np.array([[False]]),
                "beam_search_diversity_rate": np.array([[-0.25]], np.float32),
            },
            EngineBeamSearch(2, length_penalty=0.5, early_stopping=0, diversity_rate=-0.25),
        ),
        (
            {"beam_width": np.array([[2]], np.int32), "early_stopping": np.array([[3]], np.int32)},
            EngineBeamSearch(2, early_stopping=3),
        ),
    ],
)
def test_parse_items_reads_beam_search(
    extra: dict[str, Any], beam: EngineBeamSearch | None
) -> None:
    inputs = _inputs(**extra)
    ((request, context),) = parse_items(inputs, id_prefix="k", exclude_input_default=False)
    assert request.beam == beam
    assert context.beam_width == (beam.width if beam else 1)
    assert request.rows == context.beam_width


def test_settings_read_max_beam_width() -> None:
    settings = settings_from_model_config(_config(gpt_model_path="m", max_beam_width="4"))
    assert isinstance(settings.engine, EngineConfig)
    assert settings.engine.max_beam_width == 4


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({}, "gpt_model_path"),
        ({"gpt_model_path": "m", "max_beam_width": "0"}, "max_beam_width"),
        ({"gpt_model_path": "m", "torch_max_batch_size": "many"}, "integer"),
        ({"gpt_model_path": "m", "exclude_input_in_output": "maybe"}, "true or false"),
        ({"gpt_model_path": "m", "enable_kv_cache_reuse": "perhaps"}, "true or false"),
        ({"gpt_model_path": "m", "kv_cache_free_gpu_mem_fraction": "1.5"}, r"\(0, 1\]"),
        ({"gpt_model_path": "m", "max_tokens_in_paged_kv_cache": "0"}, "at least 1"),
        ({"gpt_model_path": "m", "tokens_per_block": "0"}, "at least 1"),
        ({"gpt_model_path": "m", "max_num_tokens": "-4"}, "at least 1"),
    ],
)
def test_settings_reject_bad_parameters(parameters: dict[str, str], message: str) -> None:
    with pytest.raises(EngineError, match=message):
        settings_from_model_config(_config(**parameters))
