"""A ``ModelStreamInfer`` call's responses read as replies, each output from its raw contents.

The responses of one call mostly carry the same output tensors (names, datatypes, shapes) and
differ only in their raw contents: where a response's tensors equal the last one's (protobuf's
own comparison, in C), its outputs are found where the last one's were (``OutputIndex``)
instead of walking the tensors' names again. Measured with ``python -m
tests.benchmarks.grpc_replies`` (2 cores, one token's response as Triton sends it), reading and
decoding a response took 6.55 µs of CPU for the ``ensemble`` entry and 5.76 for ``tensorrt_llm``
when every response's tensors were walked and its integers read through protobuf, 4.50 and 4.02
with the index kept and the integers read by ``struct`` (Triton's JSON event: 2.38 and 2.35).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tritonclient.grpc import InferResult, service_pb2

from adapters.triton.responses import Outputs, Reply
from adapters.triton.wire import OutputIndex, RawOutputs

_FINAL = "triton_final_response"
_parse = service_pb2.ModelStreamInferResponse.FromString


class ReplyReader:
    """Reads the responses of one call, in order; the wanted outputs are ``names``."""

    __slots__ = ("_index", "_names", "_tensors")

    def __init__(self, names: Sequence[str]) -> None:
        self._names = names
        self._tensors: Any = None
        """The output tensors ``_index`` was read from."""
        self._index: OutputIndex | None = None

    def read(self, message: bytes) -> Reply:
        """The reply of one response message."""
        response = _parse(message)
        if response.error_message:
            return Reply({}, error=response.error_message)
        infer = response.infer_response
        parameter = infer.parameters.get(_FINAL)
        final = None if parameter is None else parameter.bool_param
        tensors = infer.outputs
        contents = infer.raw_output_contents
        if len(contents) != len(tensors):
            return Reply(_arrays(infer, self._names), final=final)
        index = self._index
        if index is None or tensors != self._tensors:
            index = self._index = OutputIndex(tensors, self._names)
            self._tensors = tensors
        return Reply(RawOutputs(index, contents), final=final)


def _arrays(response: Any, names: Sequence[str]) -> Outputs:
    """The wanted outputs of a response without raw contents (values in typed fields)."""
    result = InferResult(response)
    arrays = {name: result.as_numpy(name) for name in names}
    return {name: array for name, array in arrays.items() if array is not None}
