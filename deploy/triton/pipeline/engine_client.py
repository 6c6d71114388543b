"""The BLS's streamed engine calls, over the server's own gRPC endpoint.

A decoupled BLS call (``exec(decoupled=True)``) can deadlock a Python backend stub that iterates
calls on several threads (Triton 2.51, and the Python backend's source since): a thread woken in
``ResponseIterator.__next__`` takes the GIL back while it holds the iterator's lock; the stub's
thread that delivers responses holds the stub's map of calls while it waits for that lock; and a
thread whose ``exec(decoupled=True)`` just returned holds the GIL while it waits for that map.
None of the three moves again, and every request of the model hangs. Our BLS serves many
requests per instance, one thread each, so its streamed engine calls go through Triton's gRPC
``ModelStreamInfer`` on the same server instead: no lock of the stub is held while a thread
waits for a response.

The server's address comes from the BLS parameter ``engine_grpc_url``, else the environment
variable ``TRITON_GATEWAY_GRPC_URL`` (set by our sidecars), else ``127.0.0.1:8001``, Triton's
default gRPC port.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import grpc  # type: ignore[import-untyped]
import numpy as np
import numpy.typing as npt
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

from deploy.triton.params import GRPC_URL_ENV

DEFAULT_URL = "127.0.0.1:8001"
_FINAL = "triton_final_response"
_UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]

Arrays = Mapping[str, npt.NDArray[Any]]


class EngineCallError(RuntimeError):
    """The engine answered with an error, or could not be reached."""


def engine_url(configured: str | None) -> str:
    """The gRPC address of the server this model runs in."""
    return configured or os.environ.get(GRPC_URL_ENV) or DEFAULT_URL


def request_message(
    model: str, inputs: Mapping[str, npt.NDArray[Any]], outputs: list[str], request_id: str
) -> service_pb2.ModelInferRequest:
    """A ``ModelInferRequest`` with raw contents that asks for an empty final response."""
    message = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, array in inputs.items():
        entry = message.inputs.add()
        entry.name = name
        entry.datatype = np_to_triton_dtype(array.dtype)
        entry.shape.extend(array.shape)
        if entry.datatype == "BYTES":
            message.raw_input_contents.append(serialize_byte_tensor(array).item())
        else:
            message.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    for name in outputs:
        message.outputs.add().name = name
    message.parameters["triton_enable_empty_final_response"].bool_param = True
    return message


def response_arrays(response: service_pb2.ModelInferResponse) -> tuple[Arrays, bool]:
    """A streamed response's outputs, and whether it is the request's final one."""
    result = InferResult(response)
    arrays = {tensor.name: result.as_numpy(tensor.name) for tensor in response.outputs}
    final = _FINAL in response.parameters and response.parameters[_FINAL].bool_param
    return {name: array for name, array in arrays.items() if array is not None}, final


class EngineClient:
    """Streamed requests to one model of the server, each its own ``ModelStreamInfer`` call."""

    def __init__(self, url: str, model: str) -> None:
        self.url = url
        self.model = model
        self._channel = grpc.insecure_channel(url, options=_UNLIMITED)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    def stream(
        self, inputs: Mapping[str, npt.NDArray[Any]], outputs: list[str], request_id: str
    ) -> Iterator[Arrays]:
        """The outputs of each response until the final one; empty responses are skipped.

        Closing the iterator early cancels the call, and Triton cancels the request.
        """
        message = request_message(self.model, inputs, outputs, request_id)
        call = self._stub.ModelStreamInfer(iter([message]))
        ended = False
        try:
            for reply in call:
                if reply.error_message:
                    raise EngineCallError(reply.error_message)
                arrays, ended = response_arrays(reply.infer_response)
                if arrays:
                    yield arrays
                if ended:
                    return
            raise EngineCallError("the engine's stream ended without a final response")
        except grpc.RpcError as exc:
            message = f"{self.url} answered {exc.code().name}: {exc.details()}"
            raise EngineCallError(message) from None
        finally:
            if not ended:
                call.cancel()

    def close(self) -> None:
        self._channel.close()
