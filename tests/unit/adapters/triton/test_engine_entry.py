"""The ``tensorrt_llm`` entry's pure parts: the engine request from ids, word lists, and the
decoding of the engine's id responses into text chunks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from adapters.contract import GenerationRequest, InvalidRequest, SamplingParams
from adapters.triton.config import parse_model_config
from adapters.triton.responses import EngineDecoder
from adapters.triton.tensors import build_inputs, requested_outputs, word_list
from adapters.triton.wire import wire_array
from tests.support.stock_configs import stock

ENGINE = parse_model_config(stock("tensorrt_llm"))
OLD_ENGINE = parse_model_config(stock("tensorrt_llm", release="v0.11"))
WORDS = {"\n": [10], "the end": [5, 6]}


class Tokens:
    """A tokenizer of single characters (id = code point), enough for the entry's logic."""

    end_id = 2
    pad_id = 0

    def word_ids(self, words: Sequence[str]) -> list[list[int]]:
        return [WORDS[word] for word in words if word]

    def text_stream(self) -> Any:
        return CharStream()


class CharStream:
    def __init__(self) -> None:
        self.held: list[int] = []

    def step(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)

    def flush(self) -> str:
        return ""


def engine_request(stream: bool = True, **params: Any) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        prompt="hi",
        params=SamplingParams(max_tokens=7, **params),
        stream=stream,
        prompt_ids=(104, 105),
        tokens=Tokens(),
    )


@pytest.mark.parametrize("params", [{"temperature": 0.0, "top_p": 1.0}, {"top_k": 1}])
def test_greedy_reaches_the_engine_as_runtime_top_k_1(params: dict[str, Any]) -> None:
    tensors = {t.name: t for t in build_inputs(engine_request(**params), ENGINE)}

    assert tensors["runtime_top_k"].array.tolist() == [[1]]
    assert "top_k" not in tensors


def test_the_engine_gets_ids_lengths_budget_and_special_ids() -> None:
    tensors = {t.name: t for t in build_inputs(engine_request(top_k=3, top_p=0.5), ENGINE)}
    assert tensors["input_ids"].array.tolist() == [[104, 105]]
    assert tensors["input_lengths"].array.tolist() == [[2]]
    assert tensors["request_output_len"].array.tolist() == [[7]]
    assert (tensors["end_id"].array.tolist(), tensors["pad_id"].array.tolist()) == ([[2]], [[0]])
    assert tensors["runtime_top_k"].array.tolist() == [[3]]
    assert tensors["runtime_top_p"].array.item() == pytest.approx(0.5)
    assert tensors["streaming"].array.tolist() == [[True]]
    assert "text_input" not in tensors and "stream" not in tensors
    assert "return_num_output_tokens" not in tensors, "the ids count the tokens"


def test_stop_words_become_a_word_list() -> None:
    tensors = {t.name: t for t in build_inputs(engine_request(stop=("\n", "the end")), ENGINE)}
    assert tensors["stop_words_list"].array.tolist() == [[[10, 5, 6], [1, 3, -1]]]
    assert word_list([]).tolist() == [[[0], [-1]]]


def test_an_engine_request_without_ids_is_refused() -> None:
    request = GenerationRequest(
        request_id="r", prompt="hi", params=SamplingParams(max_tokens=4), stream=False
    )
    with pytest.raises(InvalidRequest, match="token ids"):
        build_inputs(request, ENGINE)


def test_outputs_are_ids_and_lengths_plus_log_probs_when_asked() -> None:
    assert requested_outputs(engine_request(), ENGINE) == ["output_ids", "sequence_length"]
    asked = requested_outputs(engine_request(logprobs=True), ENGINE)
    assert asked == ["output_ids", "sequence_length", "output_log_probs"]
    assert OLD_ENGINE.is_engine and "exclude_input_in_output" not in OLD_ENGINE.accepted


def ids(values: list[int]) -> dict[str, np.ndarray[Any, Any]]:
    return {
        "output_ids": np.array([[[*values, 0, 0]]], np.int32),
        "sequence_length": np.array([[len(values)]], np.int32),
    }


def test_streamed_ids_become_text_with_exact_counts() -> None:
    decoder = EngineDecoder(CharStream(), prompt_tokens=2)
    chunks = [decoder.decode(ids([72, 105])), decoder.decode(ids([33]), final=True)]
    assert [(c.text, c.token_count, c.prompt_tokens) for c in chunks] == [
        ("Hi", 2, 2),
        ("!", 1, 2),
    ]
    assert chunks[-1].final


def test_a_whole_answer_that_echoes_the_prompt_loses_it() -> None:
    decoder = EngineDecoder(CharStream(), prompt_tokens=2, echoed=(104, 105))
    chunk = decoder.decode(ids([104, 105, 79, 107]), final=True)
    assert (chunk.text, chunk.token_count) == ("Ok", 2)
    other = EngineDecoder(CharStream(), prompt_tokens=2, echoed=(104, 105))
    assert other.decode(ids([79, 107]), final=True).text == "Ok", "no echo, nothing cut"


def test_log_probs_of_the_new_tokens_only() -> None:
    decoder = EngineDecoder(CharStream(), prompt_tokens=1)
    first = {**ids([65]), "output_log_probs": np.array([[[-0.5, 0.0, 0.0]]], np.float32)}
    second = {**ids([66]), "output_log_probs": np.array([[[-0.5, -1.5, 0.0]]], np.float32)}
    assert decoder.decode(first).logprobs == (-0.5,)
    assert decoder.decode(second).logprobs == (-1.5,)


def test_wire_arrays_from_raw_contents() -> None:
    raw = b"".join(len(x).to_bytes(4, "little") + x for x in (b"ab", b"", "é".encode()))
    assert wire_array("BYTES", raw, (1, 3)).tolist() == [[b"ab", b"", "é".encode()]]
    numbers = np.array([[1, -2]], np.int32)
    assert wire_array("INT32", numbers.tobytes(), (1, 2)).tolist() == [[1, -2]]


def test_the_engine_is_asked_for_its_reused_blocks_where_its_block_size_is_known() -> None:
    from dataclasses import replace

    assert "return_perf_metrics" not in {t.name for t in build_inputs(engine_request(), ENGINE)}
    sized = replace(ENGINE, tokens_per_block=32)
    tensors = {t.name: t for t in build_inputs(engine_request(), sized)}
    assert tensors["return_perf_metrics"].array.tolist() == [[True]]
    assert requested_outputs(engine_request(), sized)[-1] == "kv_cache_reused_blocks"
    assert "kv_cache_reused_blocks" not in requested_outputs(engine_request(), OLD_ENGINE)
