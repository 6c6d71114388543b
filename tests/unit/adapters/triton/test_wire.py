"""An input tensor built from lists is sent as the same array-built one would be: the same JSON
for Triton's ``generate_stream``, the same dtype, shape and raw bytes for gRPC, the same input
without its batch dim."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from adapters.contract import InvalidRequest
from adapters.triton.http.wire import carries, generate_body
from adapters.triton.wire import NUMPY_TYPES, WireTensor, flag, scalar, text

CASES: list[tuple[str, str, Any]] = [
    ("input_ids", "INT32", [[5, 6, 7, 8]]),
    ("input_lengths", "INT32", [[4]]),
    ("temperature", "FP32", [[0.5]]),
    ("seed", "UINT64", [[2**63 + 5]]),
    ("streaming", "BOOL", [[True]]),
    ("text_input", "BYTES", [["héllo".encode()]]),
    ("stop_words", "BYTES", [[b"a", b"b c"]]),
]


def _as_array(datatype: str, data: Any) -> np.ndarray[Any, Any]:
    return np.array(data, dtype=NUMPY_TYPES.get(datatype, object))


@pytest.mark.parametrize(("name", "datatype", "data"), CASES)
def test_lists_go_out_as_the_array_would(name: str, datatype: str, data: Any) -> None:
    listed = WireTensor(name, datatype, data)
    arrayed = WireTensor(name, datatype, _as_array(datatype, data))
    assert listed.ndim == arrayed.ndim == 2
    assert generate_body("r", [listed]) == generate_body("r", [arrayed])
    assert listed.array.dtype == arrayed.array.dtype
    assert listed.array.shape == arrayed.array.shape
    assert listed.raw_bytes() == arrayed.raw_bytes()
    bare, bare_array = listed.unbatched(), arrayed.unbatched()
    assert bare.ndim == bare_array.ndim == 1
    assert bare.json_value() == bare_array.json_value() == listed.json_value()
    assert bare.raw_bytes() == bare_array.raw_bytes()


def test_the_helpers_build_lists_of_the_declared_type() -> None:
    assert flag("streaming", 1).json_value() == [True]  # type: ignore[arg-type]
    assert text("guide", "é").json_value() == ["é"]
    assert scalar(None, "max_tokens", 7.0, "INT32").json_value() == [7]
    assert scalar(None, "temperature", 1, "FP32").json_value() == [1.0]
    assert isinstance(scalar(None, "temperature", 1, "FP32").json_value()[0], float)
    assert scalar(None, "temperature", 0.5, "FP32").array.dtype == np.float32


def test_a_word_list_of_three_dims_is_not_carried_as_json() -> None:
    words = WireTensor("stop_words_list", "INT32", [[[1, 2], [2, -1]]])
    assert words.ndim == 3
    assert not carries([words])
    assert words.array.shape == (1, 2, 2)


@pytest.mark.parametrize("value", [1e39, -1e39])
def test_a_float_past_the_declared_type_is_refused_by_name(value: float) -> None:
    with pytest.raises(InvalidRequest) as refused:
        scalar(None, "repetition_penalty", value, "FP32")
    assert refused.value.param == "repetition_penalty"
    assert scalar(None, "repetition_penalty", 3.4e38, "FP32").json_value() == [3.4e38]
