"""The BLS's gRPC engine calls: request messages, streamed responses, the server's address."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2
from tritonclient.utils import deserialize_bytes_tensor, triton_to_np_dtype

from deploy.triton.params import GRPC_URL_ENV, local_grpc_url
from deploy.triton.pipeline.engine_client import (
    DEFAULT_URL,
    engine_url,
    request_message,
    response_arrays,
)

INPUTS = {
    "input_ids": np.array([[5, 7, 9]], np.int32),
    "streaming": np.array([[True]], np.bool_),
    "temperature": np.array([[0.5]], np.float32),
    "guided_decoding_guide": np.array([['{"type": "object"}']], object),
    "bad_words": np.array([[b"x", b"yz"]], object),
}


def _decoded(message: service_pb2.ModelInferRequest) -> dict[str, np.ndarray]:
    out = {}
    for entry, raw in zip(message.inputs, message.raw_input_contents, strict=True):
        shape = tuple(entry.shape)
        if entry.datatype == "BYTES":
            out[entry.name] = deserialize_bytes_tensor(raw).reshape(shape)
        else:
            out[entry.name] = np.frombuffer(raw, triton_to_np_dtype(entry.datatype)).reshape(shape)
    return out


def test_a_request_carries_every_input_as_triton_reads_it() -> None:
    message = request_message("tiny_tensorrt_llm", INPUTS, ["output_ids"], "bls-1")

    assert (message.model_name, message.id) == ("tiny_tensorrt_llm", "bls-1")
    assert [entry.datatype for entry in message.inputs] == [
        "INT32",
        "BOOL",
        "FP32",
        "BYTES",
        "BYTES",
    ]
    decoded = _decoded(message)
    for name in ("input_ids", "streaming", "temperature"):
        np.testing.assert_array_equal(decoded[name], INPUTS[name])
        assert decoded[name].dtype == INPUTS[name].dtype
    assert decoded["guided_decoding_guide"].tolist() == [[b'{"type": "object"}']]
    assert decoded["bad_words"].tolist() == [[b"x", b"yz"]]
    assert [output.name for output in message.outputs] == ["output_ids"]
    assert message.parameters["triton_enable_empty_final_response"].bool_param


def _response(final: bool, ids: list[int] | None) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name="m", id="bls-1")
    if ids is not None:
        tensor = response.outputs.add()
        tensor.name, tensor.datatype = "output_ids", "INT32"
        tensor.shape.extend([1, 1, len(ids)])
        response.raw_output_contents.append(np.array(ids, np.int32).tobytes())
    response.parameters["triton_final_response"].bool_param = final
    return response


def test_a_streamed_response_gives_its_arrays_and_whether_it_is_the_last() -> None:
    arrays, final = response_arrays(_response(False, [4, 2]))
    assert not final
    np.testing.assert_array_equal(arrays["output_ids"], np.array([[[4, 2]]], np.int32))

    arrays, final = response_arrays(_response(True, None))
    assert final and arrays == {}


def test_the_address_is_the_parameter_else_the_sidecars_else_tritons_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(GRPC_URL_ENV, raising=False)
    assert engine_url(None) == DEFAULT_URL == "127.0.0.1:8001"
    monkeypatch.setenv(GRPC_URL_ENV, "127.0.0.1:4242")
    assert engine_url(None) == "127.0.0.1:4242"
    assert engine_url("10.0.0.5:9001") == "10.0.0.5:9001"


@pytest.mark.parametrize(
    ("host", "url"),
    [("127.0.0.1", "127.0.0.1:8001"), ("0.0.0.0", "127.0.0.1:8001"), ("::1", "[::1]:8001")],
)
def test_a_model_reaches_its_own_server_on_a_local_address(host: str, url: str) -> None:
    assert local_grpc_url(host, 8001) == url
