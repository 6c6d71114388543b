"""The HTTP transport's pure parts and coalescing: the generate body, events out of a chunked body
however it arrives, and replies that arrive together becoming one chunk with nothing changed."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.contract import GenerationRequest, SamplingParams
from adapters.triton.config import parse_model_config
from adapters.triton.http.wire import ChunkedEvents, carries, generate_body, reply_of
from adapters.triton.responses import Exchange, Reply, _ids
from adapters.triton.tensors import build_inputs
from adapters.triton.wire import JsonOutputs, WireTensor, first_bytes, first_int
from tests.support.stock_configs import stock

SETTINGS = settings(max_examples=150, deadline=None)


def _tensor(name: str, datatype: str, value: Any) -> WireTensor:
    kind = {"BYTES": object, "BOOL": np.bool_, "INT32": np.int32, "FP16": np.float16}
    return WireTensor(name, datatype, np.array(value, dtype=kind.get(datatype, np.float32)))


def test_the_generate_body_drops_the_batch_dimension() -> None:
    tensors = [
        _tensor("input_ids", "INT32", [[5, 7, 9]]),
        _tensor("request_output_len", "INT32", [[4]]),
        _tensor("streaming", "BOOL", [[True]]),
        _tensor("stop_words_list", "INT32", [[[3, 4], [1, -1]]]),
        _tensor("guided_decoding_guide", "BYTES", [[b'{"a": 1}']]),
    ]
    body = json.loads(generate_body("req-1", tensors, priority=2))
    assert body == {
        "id": "req-1",
        "input_ids": [5, 7, 9],
        "request_output_len": [4],
        "streaming": [True],
        "stop_words_list": [[3, 4], [1, -1]],
        "guided_decoding_guide": ['{"a": 1}'],
        "parameters": {"priority": 2},
    }
    assert "parameters" not in json.loads(generate_body("req-2", tensors[:1]))


def test_sixteen_bit_floats_stay_on_grpc() -> None:
    assert carries([_tensor("input_ids", "INT32", [[1]])])
    assert not carries([_tensor("lora_weights", "FP16", [[0.5]]), _tensor("x", "INT32", [[1]])])


def test_word_lists_stay_on_grpc() -> None:
    # [batch, 2, N]: Triton's generate endpoint would read the two rows as one dimension.
    words = _tensor("stop_words_list", "INT32", [[[5, 6], [2, -1]]])
    assert not carries([_tensor("input_ids", "INT32", [[1, 2]]), words])


def test_replies_are_shaped_as_the_grpc_outputs() -> None:
    one = reply_of(b'{"model_name": "m", "output_ids": 11, "sequence_length": 1}')
    assert one.outputs["output_ids"].tolist() == [[[11]]]
    many = reply_of(b'{"output_ids": [1, 2, 3], "output_log_probs": [-0.5, -1.0, -2.0]}')
    assert many.outputs["output_ids"].shape == (1, 1, 3)
    text = reply_of('{"text_output": "héllo"}'.encode())
    assert text.outputs["text_output"].reshape(-1)[0] == "héllo".encode()
    failed = reply_of(b'{"error": "request_output_len must be at least 1"}')
    assert failed.error == "request_output_len must be at least 1" and failed.outputs == {}


@SETTINGS
@given(
    ids=st.one_of(st.integers(0, 2**31 - 1), st.lists(st.integers(0, 2**31 - 1), max_size=6),
                  st.lists(st.lists(st.integers(0, 99), min_size=2, max_size=2), min_size=1,
                           max_size=3)),
    length=st.one_of(st.none(), st.integers(0, 6), st.lists(st.integers(0, 6), min_size=1,
                                                            max_size=1)),
    text=st.one_of(st.none(), st.text(st.characters(exclude_categories=["Cs"]), max_size=8)),
    count=st.one_of(st.none(), st.integers(0, 9), st.lists(st.integers(0, 9), max_size=1)),
)  # fmt: skip
def test_json_outputs_read_the_same_values_as_their_arrays(
    ids: Any, length: Any, text: str | None, count: Any
) -> None:
    """The ids, counts and text of an event read straight from its JSON values are those its
    arrays give (a nested list, which JSON flattens only for arrays, goes the arrays' way)."""
    event: dict[str, Any] = {"model_name": "m", "output_ids": ids}
    for name, value in (("sequence_length", length), ("text_output", text),
                        ("num_output_tokens", count)):  # fmt: skip
        if value is not None:
            event[name] = value
    outputs = reply_of(json.dumps(event).encode()).outputs
    as_arrays = {name: outputs[name] for name in outputs}
    assert isinstance(outputs, JsonOutputs) and not isinstance(as_arrays, JsonOutputs)
    assert _ids(outputs) == _ids(as_arrays)
    for name in ("sequence_length", "num_output_tokens", "num_input_tokens"):
        assert first_int(outputs, name) == first_int(as_arrays, name)
    assert first_bytes(outputs, "text_output") == first_bytes(as_arrays, "text_output")
    if text is not None:
        assert first_bytes(outputs, "text_output") == text.encode()
    assert outputs.get("num_input_tokens") is None and "model_name" not in outputs


def _chunked(events: list[bytes], sizes: list[int]) -> bytes:
    """The events as Triton writes them: one HTTP chunk each, then the last, empty chunk."""
    body = b""
    for event in events:
        data = b"data: " + event + b"\n\n"
        body += f"{len(data):x}\r\n".encode() + data + b"\r\n"
    return body + b"0\r\n\r\n"


@SETTINGS
@given(
    # Triton's events are JSON, which holds no raw newline.
    events=st.lists(st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b),
                    max_size=8),
    cuts=st.lists(st.integers(0, 400), max_size=12),
)  # fmt: skip
def test_events_come_out_whole_however_the_bytes_arrive(
    events: list[bytes], cuts: list[int]
) -> None:
    raw = _chunked(events, [])
    parser = ChunkedEvents()
    got: list[bytes] = []
    start = 0
    for cut in [*sorted({c for c in cuts if c < len(raw)}), len(raw)]:
        parser.feed(raw[start:cut])
        got += parser.take()
        start = cut
    assert parser.ended
    assert got == events


# The ensemble as the client describes it: decoupled as its engine step is.
ENSEMBLE = dataclasses.replace(
    parse_model_config(stock("ensemble", release="latest")), decoupled=True
)


def _exchange() -> Exchange:
    request = GenerationRequest(
        request_id="r", prompt="hi", params=SamplingParams(max_tokens=9, logprobs=True), stream=True
    )
    return Exchange.of(request, ENSEMBLE)


def _reply(text: bytes, logprob: float) -> Reply:
    array = np.empty((1, 1), dtype=object)
    array[0, 0] = text
    return Reply(
        {
            "text_output": array,
            "num_output_tokens": np.array([[1]], np.int32),
            "output_log_probs": np.array([[[logprob]]], np.float32),
        }
    )


@SETTINGS
@given(
    pieces=st.lists(st.text(alphabet="aé世 \n🎉", min_size=1, max_size=3), min_size=1,
                    max_size=9),
    groups=st.lists(st.integers(1, 4), max_size=9),
)  # fmt: skip
def test_replies_that_arrive_together_make_one_chunk_of_the_same_stream(
    pieces: list[str], groups: list[int]
) -> None:
    """Coalescing: whatever the grouping, the text, counts and log probs add up the same."""
    encoded = b"".join(piece.encode() for piece in pieces)
    # Byte-level pieces, as a detokenizer may split a character across responses.
    split = [encoded[i : i + 2] for i in range(0, len(encoded), 2)]
    replies = [_reply(part, -float(i)) for i, part in enumerate(split)]

    one_by_one = _exchange()
    single = [one_by_one.on_replies([reply]) for reply in replies]
    single.append(one_by_one.on_replies(None))
    together = _exchange()
    grouped = []
    position = 0
    for size in [*groups, len(replies)]:
        if position >= len(replies):
            break
        grouped.append(together.on_replies(replies[position : position + size]))
        position += size
    grouped.append(together.on_replies(None))

    def joined(chunks: list[Any]) -> tuple[str, int, tuple[float, ...]]:
        chunks = [c for c in chunks if c is not None]
        text = "".join(c.text for c in chunks)
        return text, sum(c.token_count or 0 for c in chunks), sum((c.logprobs for c in chunks), ())

    assert joined(grouped) == joined(single)
    assert joined(single)[0] == encoded.decode()
    assert len([c for c in grouped if c is not None]) <= len(single)


@pytest.mark.parametrize("final", [False, True])
def test_a_group_is_final_when_its_last_reply_is(final: bool) -> None:
    exchange = _exchange()
    replies = [_reply(b"a", -1.0), Reply({**_reply(b"b", -1.0).outputs}, final=final)]
    chunk = exchange.on_replies(replies)
    assert chunk is not None and chunk.text == "ab" and chunk.token_count == 2
    assert chunk.final is final and exchange.finished is final


@pytest.mark.parametrize(
    ("entry", "release"), [("ensemble", "latest"), ("tensorrt_llm_bls", "v0.19")]
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reuse_stats_are_asked_for_and_read_over_http(
    entry: str, release: str, stream: bool
) -> None:
    """The flag asking for reuse stats goes in the JSON body; the reused blocks come back in the
    events' JSON and become the prompt's cached tokens, as over gRPC."""
    model = dataclasses.replace(
        parse_model_config(stock(entry, release=release)), decoupled=True, tokens_per_block=32
    )
    request = GenerationRequest(
        request_id="r", prompt="hi", params=SamplingParams(max_tokens=2), stream=stream
    )
    tensors = build_inputs(request, model)
    assert carries(tensors)
    assert json.loads(generate_body("r-1", tensors))["return_perf_metrics"] == [True]

    exchange = Exchange.of(request, model)
    assert "kv_cache_reused_blocks" in exchange.outputs
    events = [
        b'{"model_name": "m", "text_output": "a", "num_output_tokens": 1,'
        b' "kv_cache_reused_blocks": 3, "kv_cache_alloc_new_blocks": 1, "kv_cache_hit_rate": 0.75}',
        b'{"text_output": "b", "num_output_tokens": 1, "kv_cache_reused_blocks": 3}',
    ]
    chunks = [exchange.on_replies([reply_of(event)]) for event in events]
    chunks.append(exchange.on_replies(None))
    sent = [chunk for chunk in chunks if chunk is not None]
    assert "".join(chunk.text for chunk in sent) == "ab"
    assert sent[0].cached_tokens == 96
