"""The vision tower and projector of a Llava-style checkpoint: pixel values to the rows of the
prompt embedding table that the engine puts where the image's placeholder ids are."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

logger = logging.getLogger(__name__)


class VisionEncoder:
    """``get_image_features`` of the checkpoint's model, run without its language model."""

    def __init__(self, model: Any, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.device = device
        self.dtype = dtype
        self.hidden_size = int(model.config.get_text_config().hidden_size)

    @classmethod
    def load(cls, model_dir: str, device: torch.device, dtype: torch.dtype) -> VisionEncoder:
        """Load the checkpoint, keeping its vision tower and projector only."""
        from transformers import AutoModelForImageTextToText
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype)
        inner = getattr(model, "model", model)
        if isinstance(getattr(inner, "language_model", None), torch.nn.Module):
            inner.language_model = torch.nn.Identity()
        model.lm_head = torch.nn.Identity()
        model = model.to(device).eval()
        logger.info("vision encoder of %s on %s as %s", model_dir, device, dtype)
        return cls(model, device, dtype)

    def encode(self, pixel_values: npt.NDArray[Any]) -> npt.NDArray[np.float16]:
        """Feature rows ``[num_images * tokens_per_image, hidden]`` (float16) of
        ``[num_images, 3, H, W]`` pixel values, image after image."""
        if pixel_values.shape[0] == 0:
            return np.zeros((0, self.hidden_size), np.float16)
        pixels = torch.from_numpy(np.ascontiguousarray(pixel_values)).to(self.device, self.dtype)
        with torch.inference_mode():
            features = self.model.get_image_features(pixel_values=pixels)
        if not isinstance(features, torch.Tensor):
            features = getattr(features, "pooler_output", features)
        if isinstance(features, list | tuple):
            features = torch.cat([torch.as_tensor(f) for f in features])
        rows = features.reshape(-1, features.shape[-1])
        table: npt.NDArray[np.float16] = rows.float().cpu().numpy().astype(np.float16)
        return table
