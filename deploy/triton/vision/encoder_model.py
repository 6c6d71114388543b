"""The ``multimodal_encoders`` Triton model (stock v0.19 contract): processed images in
(``IMAGE`` or ``pixel_values``, ``[batch, num_images, 3, H, W]``), the prompt embedding table
and its size out (``OUT_PROMPT_EMBEDDING_TABLE`` ``[batch, rows, hidden]``,
``OUT_PROMPT_VOCAB_SIZE``), for the engine's ``prompt_embedding_table``."""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import numpy.typing as npt
import triton_python_backend_utils as pb_utils

from deploy.triton import params

logger = logging.getLogger(__name__)

PIXEL_INPUTS = ("pixel_values", "IMAGE")


def batch_tables(
    pixels: npt.NDArray[Any], encode: Any
) -> tuple[npt.NDArray[np.float16], npt.NDArray[np.int32]]:
    """Tables ``[batch, rows, hidden]`` and sizes ``[batch, 1]`` of ``[batch, N, 3, H, W]``
    pixel values (a 4-D array is one image per batch item)."""
    array = np.asarray(pixels)
    if array.ndim == 4:
        array = array[:, None]
    if array.ndim != 5:
        raise ValueError(f"images must be [batch, num_images, 3, H, W], got {array.shape}")
    tables = [encode(item) for item in array]
    rows = max(table.shape[0] for table in tables)
    hidden = tables[0].shape[1]
    out = np.zeros((len(tables), rows, hidden), np.float16)
    for index, table in enumerate(tables):
        out[index, : table.shape[0]] = table
    sizes = np.array([[table.shape[0]] for table in tables], np.int32)
    return out, sizes


class TritonPythonModel:
    """Runs the vision tower and projector of ``hf_model_path`` with PyTorch."""

    def initialize(self, args: dict[str, str]) -> None:
        from deploy.triton.engine.runner import resolve_device, resolve_dtype
        from deploy.triton.vision.encoder import VisionEncoder

        config = json.loads(args["model_config"])
        model_dir = params.parameter(config, "hf_model_path") or params.parameter(
            config, "multimodal_model_path"
        )
        if model_dir is None:
            raise pb_utils.TritonModelException(
                "multimodal_encoders: parameter hf_model_path is not set"
            )
        device = resolve_device(params.parameter(config, "torch_device") or "auto")
        dtype = resolve_dtype(params.parameter(config, "torch_dtype") or "auto", device)
        self.encoder = VisionEncoder.load(model_dir, device, dtype)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._outputs(request)))
            except Exception as exc:
                logger.exception("multimodal_encoders failed")
                error = pb_utils.TritonError(f"multimodal_encoders: {exc}")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
        return responses

    def _outputs(self, request: Any) -> list[Any]:
        pixels = None
        for name in PIXEL_INPUTS:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None and tensor.as_numpy().size:
                pixels = tensor.as_numpy()
                break
        if pixels is None:
            # A text-only request through an ensemble: an empty table, which the engine ignores.
            empty = np.zeros((1, 0, self.encoder.hidden_size), np.float16)
            table, sizes = empty, np.zeros((1, 1), np.int32)
        else:
            table, sizes = batch_tables(pixels, self.encoder.encode)
        return [
            pb_utils.Tensor("OUT_PROMPT_EMBEDDING_TABLE", table),
            pb_utils.Tensor("OUT_PROMPT_VOCAB_SIZE", sizes),
        ]

    def finalize(self) -> None:
        logger.info("multimodal_encoders unloaded")
