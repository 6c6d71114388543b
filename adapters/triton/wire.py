"""Triton's tensors on the wire: an input as sent, an output from its raw bytes, and the
one-value inputs every request carries (flags, texts, scalars in the declared dtype)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from adapters.contract import InvalidRequest
from adapters.triton.config import TensorSpec

Array = npt.NDArray[Any]

NUMPY_TYPES: dict[str, type[np.generic]] = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
_INT_LIMITS = {
    name: (int(np.iinfo(kind).min), int(np.iinfo(kind).max))
    for name, kind in NUMPY_TYPES.items()
    if issubclass(kind, np.integer)
}


@dataclass(frozen=True, slots=True)
class WireTensor:
    """One input tensor as sent: name, wire datatype and data with its leading batch dim."""

    name: str
    datatype: str
    array: Array

    def raw_bytes(self) -> bytes:
        """The tensor's contents in Triton's binary layout (length-prefixed for ``BYTES``)."""
        if self.datatype != "BYTES":
            return np.ascontiguousarray(self.array).tobytes()
        return b"".join(len(item).to_bytes(4, "little") + item for item in self.array.flat)


def wire_array(datatype: str, raw: bytes, shape: tuple[int, ...]) -> Array:
    """An output tensor from its raw contents (``BYTES``: 4-byte little-endian length prefixes)."""
    if datatype != "BYTES":
        return np.frombuffer(raw, dtype=NUMPY_TYPES.get(datatype, np.uint8)).reshape(shape)
    items = []
    offset = 0
    while offset < len(raw):
        size = int.from_bytes(raw[offset : offset + 4], "little")
        items.append(raw[offset + 4 : offset + 4 + size])
        offset += 4 + size
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


def flag(name: str, value: bool) -> WireTensor:
    return WireTensor(name, "BOOL", np.array([[value]], dtype=np.bool_))


def text(name: str, value: str) -> WireTensor:
    return WireTensor(name, "BYTES", np.array([[value.encode()]], dtype=object))


def scalar(spec: TensorSpec | None, param: str, value: float, default: str = "FP32") -> WireTensor:
    """A ``[1, 1]`` tensor of the declared dtype; integers must fit it."""
    name = spec.name if spec is not None else param
    datatype = spec.datatype if spec is not None else default
    numpy_type = NUMPY_TYPES.get(datatype)
    if numpy_type is None:
        raise InvalidRequest(f"input '{name}' has unsupported datatype {datatype}", param=param)
    limits = _INT_LIMITS.get(datatype)
    if limits is not None:
        low, high = limits
        if int(value) != value or not low <= value <= high:
            raise InvalidRequest(f"'{param}' must be an integer in [{low}, {high}]", param=param)
        value = int(value)
    return WireTensor(name, datatype, np.array([[value]], dtype=numpy_type))
