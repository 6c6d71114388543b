"""Tensors across the Python-backend stub boundary, with or without torch.

Where torch is installed numeric tensors go through DLPack: the 2.51 stub's own numpy conversion
breaks when the environment has numpy 2 (as on CUDA hosts). Without torch (the load-test
engine in an environment of numpy < 2) the stub's numpy conversion is used.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import numpy.typing as npt
import triton_python_backend_utils as pb_utils

_STRING_INPUTS = frozenset({"guided_decoding_guide_type", "guided_decoding_guide"})
HAS_TORCH = importlib.util.find_spec("torch") is not None


def as_array(tensor: Any) -> npt.NDArray[Any]:
    """An input tensor's contents."""
    if not HAS_TORCH or tensor.name() in _STRING_INPUTS:
        return np.asarray(tensor.as_numpy())
    import torch

    array: npt.NDArray[Any] = torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).cpu().numpy()
    return array


def output_tensor(name: str, value: npt.NDArray[Any]) -> Any:
    """An output tensor holding ``value``."""
    value = np.ascontiguousarray(value)
    if not HAS_TORCH:
        return pb_utils.Tensor(name, value)
    import torch

    return pb_utils.Tensor.from_dlpack(name, torch.from_numpy(value))


def inputs_of(request: Any) -> dict[str, Any]:
    """Every input of a request, by name."""
    return {tensor.name(): as_array(tensor) for tensor in request.inputs()}
