"""Response translation: Triton outputs to text deltas, token counts and log probs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from adapters.contract import TokenChunk
from adapters.triton.responses import EngineDecoder, ResponseDecoder, cached_tokens, merge_chunks


def text(value: bytes) -> np.ndarray[Any, Any]:
    return np.array([[value]], dtype=object)


def count(value: int) -> np.ndarray[Any, Any]:
    return np.array([[value]], dtype=np.int32)


def texts(decoder: ResponseDecoder, pieces: list[bytes]) -> list[str]:
    chunks = [decoder.decode({"text_output": text(p)}) for p in pieces]
    return [chunk.text for chunk in chunks] + [decoder.finish().text]


EURO = "€".encode()  # three bytes


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        ([b"Hello", b" world"], ["Hello", " world", ""]),
        ([b"a" + EURO[:1], EURO[1:2], EURO[2:] + b"b"], ["a", "", "€b", ""]),
        ([b"x" + EURO[:2]], ["x", "\ufffd"]),
        ([b"", b"\xf0\x9f", b"\x98\x80!"], ["", "", "😀!", ""]),
    ],
    ids=["ascii", "split-char", "dangling-at-end", "split-emoji"],
)
def test_deltas_decode_characters_split_across_responses(
    pieces: list[bytes], expected: list[str]
) -> None:
    assert texts(ResponseDecoder(), pieces) == expected


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        ([b"He", b"Hello", b"Hello wo", b"Hello world"], ["He", "llo", " wo", "rld", ""]),
        ([b"a" + EURO[:1], b"a" + EURO, b"a" + EURO + b"!"], ["a", "€", "!", ""]),
        ([b"Hi", b"Hi", b"Hi there"], ["Hi", "", " there", ""]),
        ([b"Hello ", b"Hello!", b"Hello!!"], ["Hello ", "!", "!", ""]),
    ],
    ids=["growing", "split-char", "repeat", "rewritten"],
)
def test_cumulative_text_is_diffed(pieces: list[bytes], expected: list[str]) -> None:
    assert texts(ResponseDecoder(cumulative=True), pieces) == expected


def test_cumulative_final_response_without_text_keeps_the_state() -> None:
    decoder = ResponseDecoder(cumulative=True)

    assert decoder.decode({"text_output": text(b"abc")}).text == "abc"
    assert decoder.decode({}, final=False).text == ""
    assert decoder.decode({"text_output": text(b"abcd")}, final=True).text == "d"


def test_streamed_counts_are_per_chunk() -> None:
    decoder = ResponseDecoder(counts="reported")
    outputs = [
        {"text_output": text(b"a"), "num_output_tokens": count(2), "num_input_tokens": count(9)},
        {"text_output": text(b"b"), "num_output_tokens": count(1), "num_input_tokens": count(9)},
        {},
    ]
    chunks = [decoder.decode(o, final=i == 2) for i, o in enumerate(outputs)]

    assert chunks == [
        TokenChunk("a", 2, prompt_tokens=9),
        TokenChunk("b", 1, prompt_tokens=9),
        TokenChunk("", 0, final=True),
    ]


def test_counts_are_none_when_the_deployment_lacks_them() -> None:
    chunk = ResponseDecoder(counts="none").decode({"text_output": text(b"a")}, final=True)

    assert chunk == TokenChunk("a", None, prompt_tokens=None, final=True)


def test_non_streamed_total() -> None:
    chunk = ResponseDecoder().decode(
        {"text_output": text(b"The end."), "num_output_tokens": count(3)}, final=True
    )

    assert (chunk.text, chunk.token_count, chunk.final) == ("The end.", 3, True)


@pytest.mark.parametrize(
    ("array", "tokens", "expected"),
    [
        (np.array([[[-0.5, -1.25]]], dtype=np.float32), 2, (-0.5, -1.25)),
        (np.array([[-0.5, -1.25, 0.0]], dtype=np.float32), 2, (-0.5, -1.25)),
        (np.array([[[-0.5], [-9.0]]], dtype=np.float32), 1, (-0.5,)),
        (np.zeros((1, 1, 0), dtype=np.float32), 0, ()),
    ],
    ids=["beam-layout", "padded", "two-beams", "empty"],
)
def test_logprobs_of_the_first_sequence(
    array: np.ndarray[Any, Any], tokens: int, expected: tuple[float, ...]
) -> None:
    chunk = ResponseDecoder().decode(
        {"text_output": text(b"x"), "num_output_tokens": count(tokens), "output_log_probs": array}
    )

    assert chunk.logprobs == expected


@pytest.mark.parametrize("counts", [True, False])
def test_streamed_logprobs_arrive_cumulative_and_come_out_new(counts: bool) -> None:
    """TensorRT-LLM repeats every log prob so far in each streamed response."""
    decoder = ResponseDecoder(counts="reported" if counts else "none")
    sent = [[-0.5], [-0.5, -1.0, -2.0], [-0.5, -1.0, -2.0]]
    new = [1, 2, 0]
    chunks = []
    for values, tokens in zip(sent, new, strict=True):
        outputs = {"text_output": text(b"x"), "output_log_probs": np.array([[values]], np.float32)}
        if counts:
            outputs["num_output_tokens"] = count(tokens)
        chunks.append(decoder.decode(outputs).logprobs)
    assert chunks == [(-0.5,), (-1.0, -2.0), ()]


def test_log_probs_count_tokens_where_the_release_reports_no_counts() -> None:
    decoder = ResponseDecoder(counts="logprobs", keep_logprobs=False)
    sent = ([-0.5, -1.0], [-0.5, -1.0, -2.0])
    outputs = [
        {"text_output": text(b"ab"), "output_log_probs": np.array([[v]], np.float32)} for v in sent
    ]
    chunks = [decoder.decode(output) for output in outputs]
    assert [(c.token_count, c.logprobs) for c in chunks] == [(2, ()), (1, ())]
    assert ResponseDecoder(counts="logprobs").decode({}, final=True).token_count == 0


@pytest.mark.parametrize(
    ("response", "expected"),
    [("Tell me. Sure!", " Sure!"), ("Sure!", "Sure!"), ("", "")],
)
def test_echoed_prompt_is_stripped(response: str, expected: str) -> None:
    decoder = ResponseDecoder(echo_prefix="Tell me.")

    assert decoder.decode({"text_output": text(response.encode())}, final=True).text == expected


def test_echo_is_stripped_once() -> None:
    decoder = ResponseDecoder(echo_prefix="ab")

    assert [decoder.decode({"text_output": text(b"ab")}).text,
            decoder.decode({"text_output": text(b"abab")}).text] == ["", "abab"]  # fmt: skip


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([TokenChunk("abc", 3, prompt_tokens=5, logprobs=(-1.0, -2.0, -3.0)),
          TokenChunk("", 0, final=True)],
         TokenChunk("abc", 3, prompt_tokens=5, logprobs=(-1.0, -2.0, -3.0), final=True)),
        ([TokenChunk("a", None), TokenChunk("b", None, final=True)],
         TokenChunk("ab", None, final=True)),
        ([TokenChunk("a", 1, logprobs=(-1.0,)), TokenChunk("b", 2, prompt_tokens=4,
                                                            logprobs=(-2.0, -3.0))],
         TokenChunk("ab", 3, prompt_tokens=4, logprobs=(-1.0, -2.0, -3.0), final=True)),
    ],
    ids=["data-then-empty-final", "uncounted", "split"],
)  # fmt: skip
def test_non_streamed_responses_merge_into_one_final_chunk(
    chunks: list[TokenChunk], expected: TokenChunk
) -> None:
    assert merge_chunks(chunks) == expected


@pytest.mark.parametrize(
    ("outputs", "tokens_per_block", "expected"),
    [
        ({"kv_cache_reused_blocks": count(3)}, 32, 96),
        ({"kv_cache_reused_blocks": count(0)}, 64, 0),
        ({"kv_cache_reused_blocks": count(3)}, None, None),  # the block size is not known
        ({}, 32, None),  # the release returns no reuse stats
    ],
)
def test_reused_blocks_become_cached_prompt_tokens(
    outputs: dict[str, Any], tokens_per_block: int | None, expected: int | None
) -> None:
    assert cached_tokens(outputs, tokens_per_block) == expected
    decoder = ResponseDecoder(tokens_per_block=tokens_per_block)
    assert decoder.decode({"text_output": text(b"x"), **outputs}).cached_tokens == expected


class _Ids:
    def step(self, ids: Any) -> str:
        return "".join(chr(96 + i) for i in ids)

    def flush(self) -> str:
        return ""


def test_the_engine_entry_reports_cached_tokens_too() -> None:
    decoder = EngineDecoder(_Ids(), prompt_tokens=40, tokens_per_block=16)
    chunk = decoder.decode(
        {"output_ids": np.array([[[1, 2]]], np.int32), "kv_cache_reused_blocks": count(2)}
    )
    assert (chunk.text, chunk.cached_tokens) == ("ab", 32)


def test_merged_chunks_keep_the_first_reported_cached_tokens() -> None:
    chunks = [TokenChunk("a", 1), TokenChunk("b", 1, cached_tokens=64), TokenChunk("", 0)]
    assert merge_chunks(chunks).cached_tokens == 64


def test_engine_beams_are_cut_to_their_lengths_with_their_log_probs() -> None:
    """A beam that ended early keeps its own ids and as many log probs, not the padding."""
    decoder = EngineDecoder(_Ids(), prompt_tokens=3, beam_text=_Ids, echoed=[9, 9])
    outputs = {
        "output_ids": np.array([[[9, 9, 1, 2, 3], [9, 9, 4, 5, -1]]], np.int32),
        "sequence_length": np.array([[5, 4]], np.int32),
        "output_log_probs": np.array([[[-0.1, -0.2, -0.3], [-0.4, -0.5, 0.0]]], np.float32),
    }
    chunk = decoder.decode(outputs, final=True)
    assert [(beam.text, beam.token_count) for beam in chunk.beams] == [("abc", 3), ("de", 2)]
    assert np.allclose(chunk.beams[0].logprobs, [-0.1, -0.2, -0.3])
    assert np.allclose(chunk.beams[1].logprobs, [-0.4, -0.5])
    assert chunk.text == "abc" and chunk.token_count == 5


def test_engine_beams_without_log_probs_asked_keep_none() -> None:
    decoder = EngineDecoder(_Ids(), prompt_tokens=1, beam_text=_Ids, keep_logprobs=False)
    outputs = {
        "output_ids": np.array([[[1], [2]]], np.int32),
        "output_log_probs": np.array([[[-0.1], [-0.2]]], np.float32),
    }
    assert [beam.logprobs for beam in decoder.decode(outputs).beams] == [(), ()]
