"""A gRPC stream response read as the exchange reads it: the wanted outputs only, each integer,
text and id row read from the raw contents giving what its array gives, and no array built for
a read that needs none."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from adapters.triton.grpc.replies import ReplyReader
from adapters.triton.responses import ResponseDecoder, _ids
from adapters.triton.wire import (
    NUMPY_TYPES,
    OutputIndex,
    RawOutputs,
    first_bytes,
    first_int,
    wire_array,
)

Output = tuple[str, str, list[int], Any]
"""An output as Triton sends it: name, datatype, shape, values."""


def _raw(datatype: str, values: Any) -> bytes:
    if datatype == "BYTES":
        return b"".join(len(item).to_bytes(4, "little") + item for item in values)
    return np.array(values, dtype=NUMPY_TYPES[datatype]).tobytes()


def _message(outputs: list[Output], final: bool | None = None) -> bytes:
    response = service_pb2.ModelStreamInferResponse()
    infer = response.infer_response
    infer.model_name, infer.id = "m", "r"
    for name, datatype, shape, values in outputs:
        tensor = infer.outputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.extend(shape)
        infer.raw_output_contents.append(_raw(datatype, values))
    if final is not None:
        infer.parameters["triton_final_response"].bool_param = final
    return bytes(response.SerializeToString())


WANTED = ["output_ids", "sequence_length", "text_output", "num_output_tokens", "num_input_tokens"]

CASES: list[list[Output]] = [
    [("text_output", "BYTES", [1, 1], [b" fox"]),
     ("num_output_tokens", "INT32", [1, 1], [1]), ("num_input_tokens", "INT32", [1, 1], [5])],
    [("text_output", "BYTES", [1, 1], ["é".encode()]),
     ("num_output_tokens", "INT64", [1, 1], [-3])],
    [("text_output", "BYTES", [1, 0], []), ("num_output_tokens", "INT32", [1, 0], [])],
    [("text_output", "BYTES", [1, 2], [b"", b"b"]), ("num_output_tokens", "UINT8", [1, 1], [255])],
    [("output_ids", "INT32", [1, 1, 4], [7, 8, 9, 0]), ("sequence_length", "INT32", [1, 1], [3])],
    [("output_ids", "INT64", [1, 2, 2], [7, 8, 9, 10]),
     ("sequence_length", "INT32", [1, 2], [2, 1])],
    [("output_ids", "INT32", [1, 1, 0], []), ("sequence_length", "INT32", [1, 1], [0])],
    [("output_ids", "INT32", [1, 1, 2], [-1, 2**31 - 1]),
     ("context_logits", "FP32", [1, 1], [0.5])],
    [("output_ids", "UINT32", [1, 1, 2], [5, 2**32 - 1])],
    [("num_output_tokens", "FP32", [1, 1], [2.5]), ("text_output", "BYTES", [1], [b"x"])],
]  # fmt: skip


@pytest.mark.parametrize("outputs", CASES)
def test_raw_outputs_read_the_same_values_as_their_arrays(outputs: list[Output]) -> None:
    reply = ReplyReader(WANTED).read(_message(outputs))
    raw = reply.outputs
    assert isinstance(raw, RawOutputs)
    as_arrays = {
        name: wire_array(datatype, _raw(datatype, values), tuple(shape))
        for name, datatype, shape, values in outputs
        if name in WANTED
    }
    assert sorted(raw) == sorted(as_arrays)
    assert _ids(raw) == _ids(as_arrays)
    for name in ("sequence_length", "num_output_tokens", "num_input_tokens", "absent"):
        assert first_int(raw, name) == first_int(as_arrays, name)
    assert first_bytes(raw, "text_output") == first_bytes(as_arrays, "text_output")
    for name, array in as_arrays.items():
        assert raw[name].dtype == array.dtype
        assert raw[name].tolist() == array.tolist()


@pytest.mark.parametrize("final", [None, False, True])
def test_the_final_flag_is_read_where_triton_sends_it(final: bool | None) -> None:
    reply = ReplyReader(WANTED).read(_message(CASES[0], final=final))
    assert reply.final is final and not reply.error


def test_an_in_band_error_is_a_reply_with_its_message() -> None:
    response = service_pb2.ModelStreamInferResponse(error_message="model 'm' failed")
    reply = ReplyReader(WANTED).read(response.SerializeToString())
    assert reply.error == "model 'm' failed" and not reply.outputs


def test_texts_counts_and_ids_are_read_without_an_array(monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed token's text, counts and ids come from the raw bytes: building arrays for
    them cost the gRPC path half its per-token CPU against the HTTP path's JSON values."""

    def no_array(*args: Any) -> Any:
        raise AssertionError("an array was built for a read that needs none")

    monkeypatch.setattr("adapters.triton.wire.wire_array", no_array)
    reader = ReplyReader(WANTED)
    for _ in range(2):  # parsed whole, then read through the index kept
        chunk = ResponseDecoder().decode(reader.read(_message(CASES[0])).outputs)
        assert (chunk.text, chunk.token_count, chunk.prompt_tokens) == (" fox", 1, 5)
    assert _ids(ReplyReader(WANTED).read(_message(CASES[4])).outputs) == [7, 8, 9]


def _values(outputs: Any) -> dict[str, tuple[str, list[Any]]]:
    return {name: (str(array.dtype), array.tolist()) for name, array in outputs.items()}


def _read_whole(message: bytes) -> tuple[str, bool | None, dict[str, tuple[str, list[Any]]]]:
    """What protobuf itself parses of a message: in-band error, final flag, wanted outputs."""
    response = service_pb2.ModelStreamInferResponse.FromString(message)
    infer = response.infer_response
    parameter = infer.parameters.get("triton_final_response")
    contents = list(infer.raw_output_contents)
    values = {
        tensor.name: wire_array(tensor.datatype, contents[index], tuple(tensor.shape))
        for index, tensor in enumerate(infer.outputs)
        if tensor.name in WANTED
    }
    final = None if parameter is None else parameter.bool_param
    return response.error_message, final, _values(values)


def _wrapped(infer: bytes) -> bytes:
    """A ``ModelStreamInferResponse`` holding ``infer`` (a serialized ``ModelInferResponse``)."""
    size = len(infer)
    prefix = bytearray()
    while size >= 0x80:
        prefix.append(size & 0x7F | 0x80)
        size >>= 7
    prefix.append(size)
    return b"\x12" + bytes(prefix) + infer


def _infer_bytes(message: bytes) -> bytes:
    infer = service_pb2.ModelStreamInferResponse.FromString(message).infer_response
    return bytes(infer.SerializeToString())


TOKEN = CASES[0]
LONG_TEXT = [("text_output", "BYTES", [1, 1], [b"x" * 300]), *TOKEN[1:]]
HUGE_TEXT = [("text_output", "BYTES", [1, 1], [b"\x32" * 20_000]), *TOKEN[1:]]
REORDERED = [TOKEN[2], TOKEN[0], TOKEN[1]]
FEWER = TOKEN[:2]
IDS = [("output_ids", "INT32", [1, 1, 1], [7]), ("sequence_length", "INT32", [1, 1], [1])]
TWO_IDS = [("output_ids", "INT32", [1, 1, 2], [7, 8]), ("sequence_length", "INT32", [1, 1], [2])]
ERROR = service_pb2.ModelStreamInferResponse(error_message="boom").SerializeToString()
STREAMS: list[list[bytes]] = [
    # A stream of tokens, its empty final response.
    [_message(TOKEN, final=False), _message(TOKEN, final=False), _message([], final=True)],
    # A text whose length prefix takes two and three bytes, and bytes that look like a field.
    [_message(TOKEN, final=False), _message(LONG_TEXT, final=False),
     _message(HUGE_TEXT, final=False), _message(TOKEN, final=False)],
    # The outputs move, one goes, a shape changes, the flag flips.
    [_message(TOKEN), _message(REORDERED), _message(FEWER), _message(TOKEN, final=True)],
    [_message(IDS, final=False), _message(TWO_IDS, final=False), _message(IDS, final=False)],
    # The same outputs, then one raw content more than before, or an unknown field after the
    # contents, or an output after them (no raw content of its own).
    [_message(TOKEN), _wrapped(_infer_bytes(_message(TOKEN)) + b"\x32\x01\x07")],
    [_message(TOKEN), _wrapped(_infer_bytes(_message(TOKEN)) + b"\x78\x01")],
    [_message(TOKEN), _wrapped(_infer_bytes(_message(TOKEN)) + b"\x2a\x05\x0a\x03ids")],
    # One raw content fewer; one replaced by an unknown field of the same bytes.
    [_message(TOKEN), _wrapped(_infer_bytes(_message(TOKEN))[:-6])],
    [_message(TOKEN), _wrapped(_infer_bytes(_message(TOKEN))[:-6] + b"\x7a\x04" + bytes(4))],
    # An in-band error after tokens; a response holding an error and a token's fields.
    [_message(TOKEN), ERROR],
    [_message(TOKEN), b"\x0a\x01e" + _message(TOKEN)],
]  # fmt: skip


@pytest.mark.parametrize("messages", STREAMS)
def test_a_call_reads_each_response_as_protobuf_parses_it(messages: list[bytes]) -> None:
    """Whether a response's outputs are where the last one's were or not, what is read is what
    protobuf parses."""
    reader = ReplyReader(WANTED)
    for message in messages:
        try:
            whole = ReplyReader(WANTED).read(message)
        except ValueError:  # an output without contents: parsed whole, it fails to read
            with pytest.raises(ValueError):
                reader.read(message)
            continue
        reply = reader.read(message)
        assert type(reply.outputs) is type(whole.outputs)
        try:
            error, final, values = _read_whole(message)
        except (ValueError, IndexError):  # outputs without contents: no values to compare
            continue
        assert (reply.error, reply.final) == (error, final)
        if not error:
            assert _values(reply.outputs) == values


def test_a_truncated_response_fails_as_protobuf_fails_it() -> None:
    reader = ReplyReader(WANTED)
    message = _message(TOKEN)
    reader.read(message)
    with pytest.raises(DecodeError):
        service_pb2.ModelStreamInferResponse.FromString(message[:-2])
    with pytest.raises(DecodeError):
        reader.read(message[:-2])
    with pytest.raises(DecodeError):  # its last raw content cut, its own length kept whole
        reader.read(_wrapped(_infer_bytes(message)[:-2]))


def test_the_output_index_is_kept_only_for_responses_it_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Like responses are read through the output index of the first: only a response with other
    output tensors has its outputs found again."""
    indexes = []

    def counting(tensors: Any, names: Any) -> OutputIndex:
        indexes.append([tensor.name for tensor in tensors])
        return OutputIndex(tensors, names)

    monkeypatch.setattr("adapters.triton.grpc.replies.OutputIndex", counting)
    reader = ReplyReader(WANTED)
    reader.read(_message(TOKEN, final=False))
    second = _message([("text_output", "BYTES", [1, 1], [b" jumps"]), *TOKEN[1:]], final=False)
    assert first_bytes(reader.read(second).outputs, "text_output") == b" jumps"
    reader.read(_message(TOKEN, final=True))
    assert len(indexes) == 1
    assert first_int(reader.read(_message(REORDERED)).outputs, "num_input_tokens") == 5
    assert indexes[-1] == [name for name, *_ in REORDERED]
