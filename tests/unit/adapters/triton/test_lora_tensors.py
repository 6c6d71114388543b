"""LoRA in request translation: task ids, weights and configs as each deployment declares them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from adapters.contract import InvalidRequest, LoraAdapter
from adapters.triton.config import ModelInputs, parse_model_config
from adapters.triton.tensors import build_inputs
from tests.support.stock_configs import with_lora_columns, without_inputs
from tests.support.tensor_cases import by_name, request, stock

BLS = parse_model_config(stock("tensorrt_llm_bls"))
WEIGHTS = np.arange(12, dtype=np.float32).reshape(1, 2, 6) / 8
CONFIG3 = np.array([[[1, 0, 8], [2, 1, 8]]], dtype=np.int32)
CONFIG4 = np.array([[[1, 0, 8, 0], [2, 1, 8, 0]]], dtype=np.int32)


def lora_tensors(model: ModelInputs, adapter: LoraAdapter, with_weights: bool) -> dict[str, Any]:
    return by_name(build_inputs(request(lora=adapter), model, lora_weights=with_weights))


def test_lora_task_id_alone_when_weights_are_cached() -> None:
    adapter = LoraAdapter("fr", task_id=7, weights=WEIGHTS, config=CONFIG3)
    tensors = lora_tensors(BLS, adapter, with_weights=False)

    assert tensors["lora_task_id"].datatype == "UINT64"
    assert tensors["lora_task_id"].array.tolist() == [[7]]
    assert "lora_weights" not in tensors
    assert "lora_config" not in tensors


@pytest.mark.parametrize(
    ("columns", "config", "expected"),
    [(3, CONFIG3, CONFIG3), (4, CONFIG3, CONFIG4), (3, CONFIG4, CONFIG3), (4, CONFIG4, CONFIG4),
     (3, CONFIG3[0], CONFIG3)],
    ids=["3-3", "3-to-4", "4-to-3", "4-4", "unbatched"],
)  # fmt: skip
def test_lora_config_matches_the_deployed_columns(columns: int, config: Any, expected: Any) -> None:
    model = parse_model_config(with_lora_columns(stock("ensemble"), columns))
    tensors = lora_tensors(model, LoraAdapter("fr", 7, WEIGHTS, config), with_weights=True)

    assert tensors["lora_config"].datatype == "INT32"
    assert tensors["lora_config"].array.tolist() == expected.tolist()
    assert tensors["lora_weights"].datatype == "FP16"
    assert tensors["lora_weights"].array.dtype == np.float16
    assert tensors["lora_weights"].array.shape == (1, 2, 6)
    np.testing.assert_allclose(tensors["lora_weights"].array, WEIGHTS)


def test_dora_adapter_on_a_three_column_deployment_is_rejected() -> None:
    dora = CONFIG4.copy()
    dora[0, 1, 3] = 1

    with pytest.raises(InvalidRequest, match="DoRA"):
        lora_tensors(BLS, LoraAdapter("d", 1, WEIGHTS, dora), with_weights=True)


def test_lora_weights_in_bfloat16() -> None:
    model = parse_model_config(with_lora_columns(stock("tensorrt_llm_bls"), 3, "TYPE_BF16"))
    values = np.array([[1.0, -2.5, 1.00390625, 3.0e-3]], dtype=np.float32)
    tensors = lora_tensors(model, LoraAdapter("b", 1, values, CONFIG3[0]), with_weights=True)

    bits = tensors["lora_weights"].array
    assert tensors["lora_weights"].datatype == "BF16"
    assert bits.dtype == np.uint16
    assert bits.shape == (1, 1, 4)
    back = (bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_allclose(back, values[np.newaxis], rtol=2**-8)
    assert bits[0, 0, 0] == 0x3F80
    assert bits[0, 0, 2] == 0x3F80, "1 + 2**-8 rounds to even"


def test_lora_on_a_deployment_without_lora_inputs() -> None:
    model = parse_model_config(without_inputs(stock("tensorrt_llm_bls"), "lora_task_id"))

    with pytest.raises(InvalidRequest) as caught:
        lora_tensors(model, LoraAdapter("x", 1), with_weights=False)
    assert caught.value.param == "model"


def test_adapter_without_loaded_weights_sends_the_task_id_only() -> None:
    tensors = lora_tensors(BLS, LoraAdapter("prefetched", 3), with_weights=True)

    assert tensors["lora_task_id"].array.tolist() == [[3]]
    assert "lora_weights" not in tensors
