"""Pure logic of the pipeline models: tokenizer tensors and the BLS request plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from deploy.triton import params
from deploy.triton.pipeline import bls_logic as bl
from deploy.triton.pipeline import tokenization as tk


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return tk.load_tokenizer(str(tiny_model_dir))


def _strings(*rows: list[str]) -> npt.NDArray[Any]:
    return np.array([[w.encode() for w in row] for row in rows], dtype=np.object_)


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, None),
        ({"k": {"string_value": "${k}"}}, None),
        ({"k": {"string_value": "  "}}, None),
        ({"k": {"string_value": "/models/x"}}, "/models/x"),
    ],
)
def test_parameter(parameters: dict[str, Any], expected: str | None) -> None:
    assert params.parameter({"parameters": parameters}, "k") == expected


@pytest.mark.parametrize(
    ("value", "default", "expected"),
    [
        (None, True, True),
        ("false", True, False),
        ("TRUE", False, True),
        ("0", True, False),
        ("1", False, True),
        ("yes", False, True),
    ],
)
def test_flag(value: str | None, default: bool, expected: bool) -> None:
    assert params.flag(value, default=default) is expected


def test_flag_rejects_other_words() -> None:
    with pytest.raises(ValueError, match="parameter accumulate_tokens must be true or false"):
        params.flag("bogus", default=True, name="accumulate_tokens")


def test_special_ids_default_to_eos_and_pad(tokenizer: Any, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    end_id, pad_id = tk.special_ids(tokenizer)
    assert (end_id, pad_id) == (reference.eos_token_id, reference.pad_token_id)
    assert (end_id, pad_id) == (
        tokenizer.token_id("<|im_end|>"),
        tokenizer.token_id("<|endoftext|>"),
    )


def test_encode_queries_pads_a_batch(tokenizer: Any) -> None:
    ids, lengths = tk.encode_queries(
        tokenizer, _strings(["Hello world"], ["Hi"]), add_special_tokens=True, pad_id=7
    )
    first = tokenizer.encode("Hello world", add_special_tokens=False)
    second = tokenizer.encode("Hi", add_special_tokens=False)
    assert ids.dtype == np.int32 and lengths.dtype == np.int32
    assert lengths.tolist() == [[len(first)], [len(second)]]
    assert ids[0].tolist() == first
    assert ids[1].tolist() == second + [7] * (len(first) - len(second))


def test_word_lists_absent_is_empty(tokenizer: Any) -> None:
    out = tk.word_lists(tokenizer, None, 3)
    assert out.shape == (3, 2, 0) and out.dtype == np.int32


def test_word_lists_only_empty_words_pad_to_one(tokenizer: Any) -> None:
    assert tk.word_lists(tokenizer, _strings(["", ""]), 1).tolist() == [[[0], [-1]]]


def test_word_lists_flat_ids_and_cumulative_offsets(tokenizer: Any) -> None:
    paris = tokenizer.encode(" Paris", add_special_tokens=False)
    capital = tokenizer.encode("the capital", add_special_tokens=False)
    out = tk.word_lists(tokenizer, _strings([" Paris", "", "the capital"], ["x", "", ""]), 2)
    width = len(paris) + len(capital)
    assert out.shape == (2, 2, width)
    assert out[0, 0].tolist() == paris + capital
    assert out[0, 1].tolist() == [len(paris), width] + [-1] * (width - 2)
    x = tokenizer.encode("x", add_special_tokens=False)
    assert out[1, 0].tolist() == x + [0] * (width - len(x))
    assert out[1, 1].tolist() == [len(x)] + [-1] * (width - 1)


def test_embedding_bias(tokenizer: Any) -> None:
    assert tk.embedding_bias(tokenizer, None, None, 2).shape == (2, 0)
    words = _strings([" Paris", "the"])
    bias = tk.embedding_bias(tokenizer, words, np.array([[2.0, -1.0]], np.float32), 1)
    assert bias.shape == (1, len(tokenizer))
    for token in tokenizer.encode(" Paris", add_special_tokens=False):
        assert bias[0, token] == 2.0
    with pytest.raises(ValueError, match="same dimension"):
        tk.embedding_bias(tokenizer, words, np.array([[1.0]], np.float32), 1)


def test_prompt_table_extra_ids() -> None:
    ids = np.array([[1, 1000, 2]], np.int32)
    out = tk.prompt_table_extra_ids(ids, np.array([[9]], np.uint64), vocab_size=900)
    assert out.tolist() == [[0, 9, 0]] and out.dtype == np.uint64


def test_sequence_ids_cuts_each_beam() -> None:
    tokens = np.array([[[1, 2, 3], [4, 5, 6]]], np.int32)
    assert tk.sequence_ids(tokens, np.array([[2, 3]], np.int32)) == [[[1, 2], [4, 5, 6]]]
    assert tk.sequence_ids(np.array([[7, 8]], np.int32), np.array([1], np.int32)) == [[[7]]]


def test_text_tensor() -> None:
    out = tk.text_tensor([["é", "b"]])
    assert out.shape == (1, 2) and out[0, 0] == "é".encode()


@pytest.mark.parametrize(
    ("text", "stops", "start", "expected"),
    [
        ("hello world", ["wor"], 0, "hello wor"),
        ("hello world", ["zzz"], 0, "hello world"),
        ("a stop b STOP", ["STOP", "stop"], 0, "a stop"),
        ("stop here then stop", ["stop"], 5, "stop here then stop"),
        ("prompt stop | gen stop x", ["stop"], 12, "prompt stop | gen stop"),
    ],
)
def test_truncate_at_stop(text: str, stops: list[str], start: int, expected: str) -> None:
    assert bl.truncate_at_stop(text, stops, start=start)[0] == expected


@pytest.mark.parametrize(
    ("accumulate", "expected"),
    [(False, ["The ca", "pit", "al"]), (True, ["The ca", "The capit", "The capital"])],
)
def test_sequence_text_stops_across_chunks(accumulate: bool, expected: list[str]) -> None:
    sequence = bl.SequenceText(accumulate, ("capital", "zzz"))
    out = [sequence.emit(delta) for delta in ["The ca", "pit", "al of", " France"]]
    assert sequence.stopped
    assert out[:3] == expected
    assert out[3] == ("The capital" if accumulate else "")


def _request(**extra: Any) -> dict[str, npt.NDArray[Any]]:
    return {
        "text_input": _strings(["hi"]),
        "max_tokens": np.array([[4]], np.int32),
        **extra,
    }


@pytest.mark.parametrize(
    ("inputs", "decoupled", "message"),
    [
        ({"max_tokens": np.array([[4]], np.int32)}, True, "text_input is required"),
        (_request(max_tokens=np.array([[0]], np.int32)), True, "max_tokens must be a single"),
        (_request(max_tokens=np.array([[1, 2]], np.int32)), True, "max_tokens must be a single"),
        (_request(text_input=_strings(["a"], ["b"])), True, "batch size of 1"),
        (_request(stream=np.array([[True]])), False, "only supported in decoupled mode"),
        (_request(num_draft_tokens=np.array([[2]], np.int32)), True, "speculative decoding"),
        (_request(image_url_input=_strings(["http://x"])), True, "multimodal"),
    ],
)
def test_plan_rejects(inputs: dict[str, npt.NDArray[Any]], decoupled: bool, message: str) -> None:
    with pytest.raises(bl.RequestError, match=message):
        bl.plan_request(inputs, decoupled=decoupled)


def test_plan_routes_tensors() -> None:
    plan = bl.plan_request(
        _request(
            stop_words=_strings(["\n\n", ""]),
            end_id=np.array([[3]], np.int32),
            top_k=np.array([[5]], np.int32),
            top_p=np.array([[0.9]], np.float32),
            length_penalty=np.array([[1.0]], np.float32),
            stream=np.array([[True]]),
            num_return_sequences=np.array([2], np.int32),
            temperature=np.array([[0.5]], np.float32),
        ),
        decoupled=True,
    )
    assert plan.streaming and plan.num_sequences == 2 and plan.stop_words == ("\n\n",)
    assert set(plan.preprocessing_inputs) == {"QUERY", "REQUEST_OUTPUT_LEN", "STOP_WORDS_DICT"} | {
        "END_ID"
    }
    assert set(plan.engine_inputs) == {
        "runtime_top_k",
        "runtime_top_p",
        "len_penalty",
        "streaming",
        "num_return_sequences",
        "temperature",
    }
    assert plan.engine_inputs["num_return_sequences"].shape == (1, 1)
    assert "DECODER_INPUT_ID" not in plan.preprocessing_outputs
    assert "INPUT_ID" in plan.preprocessing_outputs


def test_plan_asks_for_optional_preprocessing_outputs() -> None:
    plan = bl.plan_request(
        _request(
            decoder_text_input=_strings(["d"]),
            prompt_table_extra_id=np.array([[1]], np.uint64),
        ),
        decoupled=True,
    )
    assert {"DECODER_INPUT_ID", "OUT_PROMPT_TABLE_EXTRA_IDS"} <= set(plan.preprocessing_outputs)


def test_engine_inputs_leave_out_empty_lists() -> None:
    plan = bl.plan_request(_request(), decoupled=True)
    preprocessed = {
        "INPUT_ID": np.array([[1, 2]], np.int32),
        "STOP_WORDS_IDS": np.empty((1, 2, 0), np.int32),
        "EMBEDDING_BIAS": np.empty((1, 0), np.float32),
        "OUT_END_ID": np.array([[2]], np.int32),
    }
    assert set(bl.engine_inputs(plan, preprocessed)) == {"input_ids", "end_id"}


def test_engine_outputs() -> None:
    assert bl.engine_outputs(["text_output", "cum_log_probs", "sequence_length"]) == [
        "output_ids",
        "sequence_length",
        "cum_log_probs",
    ]


@pytest.mark.parametrize(
    ("output_ids", "expected"),
    [([1, 2, 3, 4], 5), ([9, 2, 3, 4], 0), ([1], 0)],
)
def test_prompt_text_length(output_ids: list[int], expected: int) -> None:
    assert bl.prompt_text_length(output_ids, [1, 2], "Hello", "Hello world") == expected
