"""Tensors across the Python-backend stub boundary, with or without torch.

With numpy < 2 (as the Python backend wants) the stub's own numpy conversion carries every
input and output on the host, and torch is imported only for an input in GPU memory, which numpy
cannot hold. The 2.51 stub's numpy conversion breaks when the environment has
numpy 2 (as on CUDA hosts): there, where torch is installed, numeric tensors go through DLPack,
and torch is imported with this module, not on a model's first request. Outputs then reach the
stub as DLPack capsules made by torch's C function: handing it the torch tensor instead cost
about 5 µs an output (the stub calls the tensor's Python-level ``__dlpack_device__``), four
outputs per streamed token. numpy's own export cannot be used: the stub marks a consumed capsule
``used_dlpack`` where numpy expects DLPack's ``used_dltensor``.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import triton_python_backend_utils as pb_utils

_STRING_INPUTS = frozenset({"guided_decoding_guide_type", "guided_decoding_guide"})
HAS_TORCH = importlib.util.find_spec("torch") is not None
DLPACK = HAS_TORCH and int(np.__version__.split(".", 1)[0]) >= 2
"""Numeric tensors cross the stub boundary through DLPack (numpy 2 with torch installed)."""
if DLPACK:
    import torch  # noqa: F401  (imported here, not on a model's first request)


def as_array(tensor: Any) -> npt.NDArray[Any]:
    """An input tensor's contents."""
    if tensor.name() in _STRING_INPUTS or not (DLPACK or (HAS_TORCH and not tensor.is_cpu())):
        return np.asarray(tensor.as_numpy())
    import torch

    array: npt.NDArray[Any] = torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).cpu().numpy()
    return array


class OutputTensors:
    """Makes the stub tensors of responses; a ``[1, 1]`` count is made once and then shared.

    A streamed response's counts (``sequence_length`` and ``num_output_tokens``: 1;
    ``num_input_tokens``: the prompt's length) repeat on every token, and making a stub tensor
    costs the engine thread several microseconds. A tensor can go out in many responses: the
    stub writes it to shared memory once, and the server copies its data out of every response
    before the stub's send returns. The model instance owns the shared tensors and lets go of
    them in its ``finalize``: one still alive when the stub tears its interpreter down outlives
    the stub's shared memory and crashes the stub on its way out.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self._counts: dict[tuple[str, int], Any] = {}
        self._capacity = capacity

    def tensor(self, name: str, value: npt.NDArray[Any]) -> Any:
        """An output tensor holding ``value``."""
        if value.shape != (1, 1) or value.dtype != np.int32:
            return _new_tensor(name, value)
        key = (name, int(value[0, 0]))
        found = self._counts.get(key)
        if found is None:
            if len(self._counts) >= self._capacity:
                self._counts.clear()
            found = self._counts[key] = _new_tensor(name, np.array([[key[1]]], np.int32))
        return found

    def clear(self) -> None:
        """Let go of the shared tensors (responses still holding one keep it alive)."""
        self._counts.clear()


def _new_tensor(name: str, value: npt.NDArray[Any]) -> Any:
    value = np.ascontiguousarray(value)
    if not DLPACK:
        return pb_utils.Tensor(name, value)
    return pb_utils.Tensor.from_dlpack(name, _capsule(value))


@functools.cache
def _torch_dlpack() -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    import torch
    from torch.utils.dlpack import to_dlpack

    return torch.from_numpy, to_dlpack


def _capsule(value: npt.NDArray[Any]) -> Any:
    from_numpy, to_dlpack = _torch_dlpack()
    return to_dlpack(from_numpy(value))


def inputs_of(request: Any) -> dict[str, Any]:
    """Every input of a request, by name."""
    return {tensor.name(): as_array(tensor) for tensor in request.inputs()}
