"""The engine's response tensors: shapes, prompt inclusion, logits, perf metrics and the output
layout of each release."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from deploy.triton.engine.outputs import ItemContext, OutputLayout, response_tensors
from deploy.triton.engine.types import EngineFinishReason, RequestBlocks, SequenceOutput, Timings


def _context(**overrides: Any) -> ItemContext:
    values: dict[str, Any] = {
        "batch_index": 1,
        "batch_size": 2,
        "prompt": np.array([5, 6], np.int32),
        "streaming": False,
        "exclude_input": False,
        "return_log_probs": True,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
        "num_return_sequences": 3,
        "max_new_tokens": 5,
        "vocab_size": 4,
    }
    return ItemContext(**(values | overrides))


LOGITS = np.arange(12, dtype=np.float32).reshape(3, 4)
OUTPUT = SequenceOutput(
    request_id="k/1",
    sequence_index=2,
    token_ids=np.array([7, 8, 9], np.int32),
    log_probs=np.array([-0.5, -1.0, -0.25], np.float32),
    cum_log_prob=-1.75,
    finish_reason=EngineFinishReason.LENGTH,
    context_logits=np.ones((2, 4), np.float32),
    generation_logits=LOGITS,
    timings=Timings(10, 20, 30, 40),
    cached_tokens=130,
    blocks=RequestBlocks(alloc_total=2, alloc_new=1, reused=3),
)
ALL = frozenset(
    {
        "output_ids",
        "sequence_length",
        "cum_log_probs",
        "output_log_probs",
        "context_logits",
        "generation_logits",
        "num_input_tokens",
        "num_output_tokens",
        "batch_index",
        "sequence_index",
        "kv_cache_alloc_new_blocks",
        "kv_cache_reused_blocks",
        "kv_cache_alloc_total_blocks",
        "arrival_time_ns",
        "last_token_time_ns",
        "acceptance_rate",
    }
)
V019 = OutputLayout(placeholders=False)
V011 = OutputLayout(placeholders=True)


@pytest.mark.parametrize(
    ("overrides", "ids", "num_output"),
    [
        ({}, [5, 6, 7, 8, 9], 5),
        ({"exclude_input": True}, [7, 8, 9], 3),
        ({"streaming": True}, [7, 8, 9], 3),
    ],
)
def test_response_tensors_shapes_and_prompt_inclusion(
    overrides: dict[str, Any], ids: list[int], num_output: int
) -> None:
    tensors = response_tensors(OUTPUT, _context(**overrides), ALL, V019)
    assert tensors["output_ids"].tolist() == [[ids]]
    assert tensors["output_ids"].dtype == np.int32
    assert tensors["sequence_length"].tolist() == [[len(ids)]]
    assert tensors["num_output_tokens"].tolist() == [[num_output]]
    assert tensors["num_input_tokens"].tolist() == [[2]]
    assert tensors["output_log_probs"].tolist() == [[[-0.5, -1.0, -0.25]]]
    assert tensors["cum_log_probs"].tolist() == [[-1.75]]
    assert tensors["batch_index"].tolist() == [[1]]
    assert tensors["sequence_index"].tolist() == [[2]]


def test_streamed_log_probs_cover_every_token_so_far() -> None:
    """As from the executor: each streamed response repeats the log probs already sent."""
    later = SequenceOutput(
        "k/1", 0, np.array([9], np.int32), OUTPUT.log_probs, -1.75, None, new_from=2
    )
    tensors = response_tensors(later, _context(streaming=True), ALL, V019)
    assert tensors["output_ids"].tolist() == [[[9]]]
    assert tensors["output_log_probs"].tolist() == [[[-0.5, -1.0, -0.25]]]


def test_counts_of_streamed_responses_are_shared_and_cannot_be_written() -> None:
    """A count is made once per value: responses of one value share it, so none may change it."""
    context = _context(streaming=True)
    first = response_tensors(OUTPUT, context, ALL, V019)
    second = response_tensors(OUTPUT, context, ALL, V019)
    for name in ("sequence_length", "num_input_tokens", "num_output_tokens", "batch_index"):
        assert first[name] is second[name], name
        assert first[name].dtype == np.int32 and first[name].shape == (1, 1), name
        with pytest.raises(ValueError, match="read-only"):
            first[name][0, 0] = 0
    assert first["num_input_tokens"].tolist() == [[2]]
    assert first["num_output_tokens"].tolist() == [[3]]


def test_batch_and_sequence_index_only_when_there_are_several() -> None:
    single = _context(batch_index=0, batch_size=1, num_return_sequences=1)
    tensors = response_tensors(OUTPUT, single, ALL, V019)
    assert "batch_index" not in tensors and "sequence_index" not in tensors


def test_logits_when_asked_for() -> None:
    context = _context(return_context_logits=True, return_generation_logits=True)
    tensors = response_tensors(OUTPUT, context, ALL, V019)
    assert tensors["context_logits"].shape == (1, 2, 4)
    generation = tensors["generation_logits"]
    assert generation.shape == (1, 1, 5, 4)  # padded to the output budget, like the executor
    assert generation[0, 0, :3].tolist() == LOGITS.tolist()
    assert not generation[0, 0, 3:].any()


def test_streamed_generation_logits_per_chunk_since_v014_and_whole_before() -> None:
    context = _context(streaming=True, return_generation_logits=True)
    chunk = SequenceOutput(
        "k/1", 0, np.array([9], np.int32), None, 0.0, None, new_from=2, generation_logits=LOGITS
    )
    new = response_tensors(chunk, context, {"generation_logits"}, V019)["generation_logits"]
    assert new.shape == (1, 1, 1, 4)
    assert new[0, 0, 0].tolist() == LOGITS[2].tolist()
    old = response_tensors(chunk, context, {"generation_logits"}, V011)["generation_logits"]
    assert old.shape == (1, 1, 5, 4)


def test_unrequested_outputs_are_placeholders_before_v014_and_absent_after() -> None:
    context = _context(return_log_probs=False)
    names = {"cum_log_probs", "output_log_probs", "context_logits", "generation_logits"}
    assert response_tensors(OUTPUT, context, names, V019) == {}
    old = response_tensors(OUTPUT, context, names, V011)
    assert {name: value.shape for name, value in old.items()} == {
        "cum_log_probs": (1, 1),
        "output_log_probs": (1, 1, 2),
        "context_logits": (1, 1, 1),
        "generation_logits": (1, 1, 1, 1),
    }
    assert not any(value.any() for value in old.values())


def test_perf_metrics_count_blocks_and_times() -> None:
    tensors = response_tensors(OUTPUT, _context(return_perf_metrics=True), ALL, V019)
    assert tensors["kv_cache_alloc_total_blocks"].tolist() == [[2]]
    assert tensors["kv_cache_alloc_new_blocks"].tolist() == [[1]]
    assert tensors["kv_cache_reused_blocks"].tolist() == [[3]]
    assert tensors["kv_cache_reused_blocks"].dtype == np.int32
    unpaged = dataclasses.replace(OUTPUT, blocks=None)
    tensors = response_tensors(unpaged, _context(return_perf_metrics=True), ALL, V019)
    assert tensors["kv_cache_reused_blocks"].tolist() == [[0]]
    assert tensors["arrival_time_ns"].tolist() == [[10]]
    assert tensors["arrival_time_ns"].dtype == np.int64
    assert tensors["last_token_time_ns"].tolist() == [[40]]
    assert tensors["acceptance_rate"].dtype == np.float32
    assert "arrival_time_ns" not in response_tensors(OUTPUT, _context(), ALL, V019)


def test_streamed_perf_metrics_come_with_the_first_and_the_last_response() -> None:
    context = _context(streaming=True, return_perf_metrics=True)
    first = dataclasses.replace(OUTPUT, new_from=0, finish_reason=None)
    middle = dataclasses.replace(OUTPUT, new_from=1, finish_reason=None)
    last = dataclasses.replace(OUTPUT, new_from=2)
    carried = [
        "kv_cache_reused_blocks" in response_tensors(output, context, ALL, V019)
        for output in (first, middle, last)
    ]
    assert carried == [True, False, True]


def test_response_tensors_send_only_what_was_requested_and_asked_for() -> None:
    context = _context(return_log_probs=False, return_num_output_tokens=False)
    tensors = response_tensors(
        OUTPUT, context, {"output_ids", "cum_log_probs", "num_output_tokens"}, V011
    )
    assert set(tensors) == {"output_ids", "cum_log_probs"}
    assert tensors["cum_log_probs"].tolist() == [[0.0]]


def test_response_tensors_of_an_empty_final_chunk() -> None:
    empty = SequenceOutput("k/0", 0, np.zeros(0, np.int32), None, 0.0, EngineFinishReason.END_ID)
    tensors = response_tensors(empty, _context(streaming=True), ALL, V019)
    assert tensors["output_ids"].shape == (1, 1, 0)
    assert tensors["num_output_tokens"].tolist() == [[0]]


@pytest.mark.parametrize(
    ("outputs", "layout"),
    [
        ([{"name": "context_logits", "data_type": "TYPE_FP32"}], OutputLayout(np.float32, True)),
        (
            [
                {"name": "context_logits", "data_type": "TYPE_FP16"},
                {"name": "sequence_index", "data_type": "TYPE_INT32"},
            ],
            OutputLayout(np.float16, False),
        ),
    ],
)
def test_output_layout_from_the_config(outputs: list[dict[str, str]], layout: OutputLayout) -> None:
    assert OutputLayout.from_model_config({"output": outputs}) == layout
