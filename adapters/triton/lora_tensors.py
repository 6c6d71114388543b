"""An adapter's tensors: its task id, and on first use its weights and config in the dtype and
the config columns the deployed model declares."""

from __future__ import annotations

import numpy as np

from adapters.contract import InvalidRequest, LoraAdapter
from adapters.triton.config import ModelInputs, TensorSpec
from adapters.triton.wire import NUMPY_TYPES, Array, WireTensor, scalar


def lora_inputs(
    adapter: LoraAdapter, model: ModelInputs, *, with_weights: bool
) -> list[WireTensor]:
    """``lora_task_id``, plus the weights and config in the dtype and columns the model wants."""
    task = model.inputs.get("lora_task_id")
    if task is None:
        raise InvalidRequest(
            "This deployment does not serve LoRA adapters.",
            param="model",
            detail=f"Triton model {model.name} has no lora_task_id input",
        )
    tensors = [scalar(task, "model", adapter.task_id)]
    if not with_weights or adapter.weights is None or adapter.config is None:
        return tensors
    weights_spec = model.inputs.get("lora_weights")
    columns = model.lora_config_columns
    if weights_spec is None or columns is None:
        raise InvalidRequest("this deployment does not accept LoRA weights", param="model")
    tensors.append(_lora_weights(adapter, weights_spec))
    tensors.append(WireTensor("lora_config", "INT32", _lora_config(adapter, columns)))
    return tensors


def _lora_weights(adapter: LoraAdapter, spec: TensorSpec) -> WireTensor:
    weights = _with_batch(np.asarray(adapter.weights), 2)
    if spec.datatype == "BF16":
        return WireTensor(spec.name, "BF16", _bfloat16_bits(weights))
    numpy_type = NUMPY_TYPES.get(spec.datatype)
    if numpy_type is None or not np.issubdtype(numpy_type, np.floating):
        raise InvalidRequest(
            "This deployment cannot take this adapter's weights.",
            param="model",
            detail=f"unsupported lora_weights datatype {spec.datatype}",
        )
    return WireTensor(spec.name, spec.datatype, weights.astype(numpy_type, copy=False))


def _lora_config(adapter: LoraAdapter, columns: int) -> Array:
    """Rows ``[module_id, layer_idx, adapter_size(, is_dora)]`` with the model's column count."""
    config = _with_batch(np.asarray(adapter.config), 2).astype(np.int32, copy=False)
    have = config.shape[-1]
    if have == columns:
        return config
    if have == 3 and columns == 4:
        return np.concatenate([config, np.zeros((*config.shape[:-1], 1), np.int32)], axis=-1)
    if have == 4 and columns == 3 and not config[..., 3].any():
        return np.ascontiguousarray(config[..., :3])
    raise InvalidRequest(
        f"adapter '{adapter.name}' has {have}-column lora_config, the model takes {columns}"
        + (" (DoRA adapters need 4)" if have == 4 else ""),
        param="model",
    )


def _with_batch(array: Array, ndim: int) -> Array:
    """Add the leading batch dim to a 2-D adapter array (``.npy`` files usually carry it)."""
    if array.ndim == ndim:
        return array[np.newaxis]
    if array.ndim == ndim + 1 and array.shape[0] == 1:
        return array
    raise InvalidRequest(f"LoRA array of shape {array.shape} is not [1, rows, cols]", param="model")


def _bfloat16_bits(array: Array) -> Array:
    """bfloat16 as uint16 bits: kept as is when already bfloat16, else rounded to nearest even."""
    if array.dtype.name == "bfloat16":
        return array.view(np.uint16)
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)
