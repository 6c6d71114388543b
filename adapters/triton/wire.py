"""Triton's tensors on the wire: an input as sent, an output from its raw bytes, and the
one-value inputs every request carries (flags, texts, scalars in the declared dtype).

An input holds an array, or nested lists of one shape that become an array only where the wire
needs one (gRPC's raw contents): a request sent as JSON over HTTP builds none. An output is
read the same way round: a streamed token's text, counts and ids come from the JSON values
(``JsonOutputs``) or the gRPC raw contents (``RawOutputs``) themselves, an array only where a
caller asks for one."""

from __future__ import annotations

import struct
from collections.abc import Container, Iterator, Mapping
from typing import Any, Literal

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
_PYTHON_TYPES = {"BOOL": bool, "FP16": float, "FP32": float, "FP64": float}
_FLOAT_LIMITS = {"FP16": float(np.finfo(np.float16).max), "FP32": float(np.finfo(np.float32).max)}
_INT_LIMITS = {
    name: (int(np.iinfo(kind).min), int(np.iinfo(kind).max))
    for name, kind in NUMPY_TYPES.items()
    if issubclass(kind, np.integer)
}


class WireTensor:
    """One input tensor as sent: name, wire datatype and data with its leading batch dim (an
    array, or nested lists of one shape: ``BYTES`` items as ``bytes``)."""

    __slots__ = ("_array", "_data", "datatype", "name")

    def __init__(self, name: str, datatype: str, data: Array | list[Any]) -> None:
        self.name = name
        self.datatype = datatype
        self._data = data
        self._array: Array | None = data if isinstance(data, np.ndarray) else None

    def __repr__(self) -> str:
        return f"WireTensor({self.name!r}, {self.datatype!r}, {self._data!r})"

    @property
    def array(self) -> Array:
        """The data as an array of the wire datatype (built on first use)."""
        if self._array is None:
            self._array = np.array(self._data, dtype=NUMPY_TYPES.get(self.datatype, object))
        return self._array

    @property
    def ndim(self) -> int:
        """The number of dimensions, the batch dim included."""
        if self._array is not None:
            return int(self._array.ndim)
        depth = 0
        value: Any = self._data
        while isinstance(value, list):
            depth += 1
            value = value[0] if value else None
        return depth

    def unbatched(self) -> WireTensor:
        """The same input without its leading batch dim."""
        data = self._data
        inner = data[0] if isinstance(data, list) else self.array[0]
        return WireTensor(self.name, self.datatype, inner)

    def json_value(self) -> list[Any]:
        """The data as Triton's JSON ``generate`` reads an input: one list (the batch dim
        dropped where there is another), texts decoded."""
        data: Any = self._data if self._array is None else self._array.tolist()
        value = data[0] if self.ndim > 1 else data
        if self.datatype == "BYTES":
            return [item.decode() for item in _flat(value)]
        return value  # type: ignore[no-any-return]

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


def _flat(value: Any) -> list[Any]:
    if not isinstance(value, list):
        return [value]
    return [item for part in value for item in _flat(part)]


def flag(name: str, value: bool) -> WireTensor:
    return WireTensor(name, "BOOL", [[bool(value)]])


def text(name: str, value: str) -> WireTensor:
    return WireTensor(name, "BYTES", [[value.encode()]])


def scalar(spec: TensorSpec | None, param: str, value: float, default: str = "FP32") -> WireTensor:
    """A ``[1, 1]`` tensor of the declared dtype; integers must fit it."""
    name = spec.name if spec is not None else param
    datatype = spec.datatype if spec is not None else default
    numpy_type = NUMPY_TYPES.get(datatype)
    if numpy_type is None:
        raise InvalidRequest(
            f"'{param}' is not supported by this model.",
            param=param,
            detail=f"input '{name}' has unsupported datatype {datatype}",
        )
    limits = _INT_LIMITS.get(datatype)
    if limits is not None:
        low, high = limits
        if int(value) != value or not low <= value <= high:
            raise InvalidRequest(f"'{param}' must be an integer in [{low}, {high}]", param=param)
        return WireTensor(name, datatype, [[int(value)]])
    value = _PYTHON_TYPES[datatype](value)
    bound = _FLOAT_LIMITS.get(datatype)
    if bound is not None and not -bound <= value <= bound:
        raise InvalidRequest(f"'{param}' must be within [-{bound:g}, {bound:g}]", param=param)
    return WireTensor(name, datatype, [[value]])


class JsonOutputs(Mapping[str, Array]):
    """The outputs of one event of Triton's JSON ``generate_stream``, each read as an array shaped
    as gRPC's (``[1, 1, n]``, a text ``[1, 1]``), built when first read; ``ints`` (and the
    module's ``first_int`` and ``first_bytes``) read the JSON values themselves, without an
    array."""

    __slots__ = ("_arrays", "raw")

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self._arrays: dict[str, Array] = {}

    def __getitem__(self, name: str) -> Array:
        array = self._arrays.get(name)
        if array is None:
            array = self._arrays[name] = _json_array(self.raw[name])
        return array

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self.raw else default

    def __contains__(self, name: object) -> bool:
        return name in self.raw

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def ints(self, name: str) -> list[int] | None:
        """An integer output of one value or one flat list, as ints; ``None`` otherwise."""
        value = self.raw.get(name)
        if type(value) is int:
            return [value]
        if type(value) is list and all(type(item) is int for item in value):
            return value
        return None


class OutputIndex:
    """Where a gRPC response's wanted outputs are, read once from its output tensors: each one's
    position among the raw contents, its datatype, and its tensor (for the shape, read only where
    an array is built). ``names`` are the outputs wanted; the others are never read."""

    __slots__ = ("_rows", "_shapes", "entries")

    def __init__(self, tensors: Any, names: Container[str]) -> None:
        self.entries: dict[str, tuple[int, str, Any]] = {}
        for position, tensor in enumerate(tensors):
            name = tensor.name
            if name in names:
                self.entries[name] = (position, tensor.datatype, tensor)
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._rows: dict[str, struct.Struct | None] = {}

    def shape(self, name: str) -> tuple[int, ...]:
        """A wanted output's shape (read once)."""
        shape = self._shapes.get(name)
        if shape is None:
            shape = self._shapes[name] = tuple(self.entries[name][2].shape)
        return shape

    def row(self, name: str) -> struct.Struct | None:
        """The reader of a wanted ``INT32`` or ``INT64`` output's first row (over its last axis,
        little-endian as Triton sends it); ``None`` for another datatype or no shape."""
        if name in self._rows:
            return self._rows[name]
        code = _ROW_CODES.get(self.entries[name][1])
        shape = self.shape(name)
        row = struct.Struct(f"<{shape[-1]}{code}") if code is not None and shape else None
        self._rows[name] = row
        return row


class RawOutputs(Mapping[str, Array]):
    """The outputs of one gRPC response, read from their raw contents: each an array (shaped as
    the response says) only when read as one; ``ints`` (and the module's ``first_int`` and
    ``first_bytes``) read integers and texts from the bytes themselves, without an array.

    ``index`` says where each wanted output is among ``contents``, the response's raw contents
    (one per output tensor, in the same order)."""

    __slots__ = ("_arrays", "_contents", "_entries", "_index")

    def __init__(self, index: OutputIndex, contents: Any) -> None:
        self._index = index
        self._entries = index.entries
        self._contents = contents
        self._arrays: dict[str, Array] | None = None

    def __getitem__(self, name: str) -> Array:
        arrays = self._arrays
        if arrays is None:
            arrays = self._arrays = {}
        array = arrays.get(name)
        if array is None:
            position, datatype, _ = self._entries[name]
            array = wire_array(datatype, self._contents[position], self._index.shape(name))
            arrays[name] = array
        return array

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self._entries else default

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def first_int(self, name: str) -> int | None:
        """The module's ``first_int`` of this response, from the bytes for an integer output."""
        entry = self._entries.get(name)
        if entry is None:
            return None
        position, datatype, _ = entry
        reader = _FIRST_INTS.get(datatype)
        if reader is None:
            return _first_int(self[name])
        raw = self._contents[position]
        if len(raw) < reader.size:
            return None
        value: int = reader.unpack_from(raw)[0]
        return value

    def first_bytes(self, name: str) -> bytes | None:
        """The module's ``first_bytes`` of this response, from the bytes for a text output."""
        entry = self._entries.get(name)
        if entry is None:
            return None
        position, datatype, _ = entry
        if datatype != "BYTES":
            return _first_bytes(self[name])
        raw: bytes = self._contents[position]
        if len(raw) < 4:
            return None
        return raw[4 : 4 + _LENGTH.unpack_from(raw)[0]]

    def ints(self, name: str) -> list[int] | None:
        """The first row (over the last axis) of an ``INT32`` or ``INT64`` output, as ints;
        ``None`` where the output is absent or of another datatype."""
        entry = self._entries.get(name)
        if entry is None:
            return None
        position, datatype, _ = entry
        raw = self._contents[position]
        row = self._index.row(name)
        if row is not None and len(raw) >= row.size:
            return list(row.unpack_from(raw))
        code = _ROW_CODES.get(datatype)
        if code is None:
            return None
        shape = self._index.shape(name)
        values = memoryview(raw).cast(code)
        ints: list[int] = (values if not shape else values[: shape[-1]]).tolist()
        return ints


_FIRST_INTS = {datatype: struct.Struct(f"<{code}") for datatype, code in (
    ("INT8", "b"), ("INT16", "h"), ("INT32", "i"), ("INT64", "q"),
    ("UINT8", "B"), ("UINT16", "H"), ("UINT32", "I"), ("UINT64", "Q"),
)}  # fmt: skip
"""Readers of an integer output's first value, little-endian as Triton sends it."""
_LENGTH = struct.Struct("<I")
"""A ``BYTES`` item's length prefix."""
_ROW_CODES: dict[str, Literal["i", "q"]] = {"INT32": "i", "INT64": "q"}
"""``memoryview`` formats of the integer outputs read as rows: native order, as numpy reads
them (Triton sends little-endian, the order of every host it runs on)."""


def first_int(outputs: Mapping[str, Array], name: str) -> int | None:
    """The first value of an integer output; ``None`` where it is absent or empty."""
    if type(outputs) is RawOutputs:
        return outputs.first_int(name)
    if isinstance(outputs, JsonOutputs) and type(value := outputs.raw.get(name)) is int:
        return value
    return _first_int(outputs.get(name))


def first_bytes(outputs: Mapping[str, Array], name: str) -> bytes | None:
    """The first value of a text output; ``None`` where it is absent or empty."""
    if type(outputs) is RawOutputs:
        return outputs.first_bytes(name)
    if isinstance(outputs, JsonOutputs) and type(value := outputs.raw.get(name)) is str:
        return value.encode()
    return _first_bytes(outputs.get(name))


def _first_int(array: Array | None) -> int | None:
    return None if array is None or array.size == 0 else int(array.reshape(-1)[0])


def _first_bytes(array: Array | None) -> bytes | None:
    if array is None or array.size == 0:
        return None
    item = array.reshape(-1)[0]
    return item if isinstance(item, bytes) else str(item).encode()


def _json_array(value: Any) -> Array:
    if isinstance(value, str):
        array = np.empty(1, dtype=object)
        array[0] = value.encode()
        return array.reshape(1, 1)
    return np.asarray(value).reshape(1, 1, -1)
