"""A gRPC stream response read as the exchange reads it: the wanted outputs only, each integer,
text and id row read from the raw contents giving what its array gives, and no array built for
a read that needs none."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from adapters.triton.grpc import stream
from adapters.triton.responses import ResponseDecoder, _ids
from adapters.triton.wire import NUMPY_TYPES, RawOutputs, first_bytes, first_int, wire_array

Output = tuple[str, str, list[int], Any]
"""An output as Triton sends it: name, datatype, shape, values."""


def _raw(datatype: str, values: Any) -> bytes:
    if datatype == "BYTES":
        return b"".join(len(item).to_bytes(4, "little") + item for item in values)
    return np.array(values, dtype=NUMPY_TYPES[datatype]).tobytes()


def _message(outputs: list[Output], final: bool | None = None) -> Any:
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
    return service_pb2.ModelStreamInferResponse.FromString(response.SerializeToString())


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
    reply = stream._reply(_message(outputs), WANTED)
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
    reply = stream._reply(_message(CASES[0], final=final), WANTED)
    assert reply.final is final and not reply.error


def test_an_in_band_error_is_a_reply_with_its_message() -> None:
    response = service_pb2.ModelStreamInferResponse(error_message="model 'm' failed")
    reply = stream._reply(response, WANTED)
    assert reply.error == "model 'm' failed" and not reply.outputs


def test_texts_counts_and_ids_are_read_without_an_array(monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed token's text, counts and ids come from the raw bytes: building arrays for
    them cost the gRPC path half its per-token CPU against the HTTP path's JSON values."""

    def no_array(*args: Any) -> Any:
        raise AssertionError("an array was built for a read that needs none")

    monkeypatch.setattr("adapters.triton.wire.wire_array", no_array)
    monkeypatch.setattr("adapters.triton.grpc.stream.wire_array", no_array, raising=False)
    chunk = ResponseDecoder().decode(stream._reply(_message(CASES[0]), WANTED).outputs)
    assert (chunk.text, chunk.token_count, chunk.prompt_tokens) == (" fox", 1, 5)
    assert _ids(stream._reply(_message(CASES[4]), WANTED).outputs) == [7, 8, 9]
