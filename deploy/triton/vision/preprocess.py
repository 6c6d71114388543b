"""The preprocessing model's image side: a prompt's images read from ``IMAGE_URL`` or
``IMAGE_BYTES``, turned into ``PIXEL_VALUES``, and its image tokens into placeholder ids."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from deploy.triton.pipeline.tokenization import as_text, right_padded
from deploy.triton.vision.images import (
    ImageInputError,
    ImageProcessor,
    images_from_arrays,
    images_from_urls,
)
from deploy.triton.vision.placeholders import expand
from deploy.triton.vision.settings import VisionSettings, read_settings


class VisionPreprocessor:
    """Images and image tokens of the checkpoint in ``model_dir``."""

    def __init__(self, model_dir: str) -> None:
        settings = read_settings(model_dir)
        if settings is None:
            raise ValueError(f"{model_dir} holds no vision model (no vision_config)")
        self.settings: VisionSettings = settings
        self.processor = ImageProcessor(model_dir)

    def images(
        self, urls: npt.NDArray[Any] | None, arrays: npt.NDArray[Any] | None, batch: int
    ) -> list[list[Any]]:
        """Each batch item's images, from ``IMAGE_URL`` or ``IMAGE_BYTES``."""
        if urls is not None and arrays is not None and urls.size and arrays.size:
            raise ImageInputError("send images as IMAGE_URL or IMAGE_BYTES, not both")
        if urls is not None and urls.size:
            rows = np.asarray(urls).reshape(urls.shape[0], -1)
            return [images_from_urls(rows[min(i, rows.shape[0] - 1)]) for i in range(batch)]
        if arrays is not None and arrays.size:
            return [images_from_arrays(arrays[min(i, arrays.shape[0] - 1)]) for i in range(batch)]
        return [[] for _ in range(batch)]

    def pixel_values(self, images: list[list[Any]]) -> npt.NDArray[np.float16]:
        """``[batch, num_images, 3, H, W]``; ``[batch, 0, 3, 1, 1]`` when no item has one."""
        counts = {len(item) for item in images}
        if counts == {0}:
            return np.zeros((len(images), 0, 3, 1, 1), np.float16)
        if len(counts) != 1:
            raise ImageInputError("every item of a batch must carry as many images")
        return np.stack([self.processor.pixel_values(item) for item in images])

    def encode(
        self,
        tokenizer: Any,
        queries: npt.NDArray[Any],
        images: list[list[Any]],
        *,
        add_special_tokens: bool,
        pad_id: int,
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """Right-padded ids ``[B, L]`` with image tokens replaced by placeholder ids, and
        lengths ``[B, 1]``."""
        encoded = []
        for row, item in zip(queries, images, strict=True):
            ids = tokenizer.encode(
                as_text(row.reshape(-1)[0]), add_special_tokens=add_special_tokens
            )
            try:
                encoded.append(expand(ids, len(item), self.settings))
            except ValueError as exc:
                raise ImageInputError(str(exc)) from exc
        return right_padded(encoded, pad_id)
