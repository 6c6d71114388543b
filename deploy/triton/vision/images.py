"""Images as the stock preprocessing takes them (``IMAGE_URL`` data URLs, ``IMAGE_BYTES`` RGB
arrays) decoded and turned into the pixel values of the checkpoint's image processor."""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

MAX_PIXELS = 40_000_000
"""Larger images are refused before they are decoded (a decompression bomb guard)."""


class ImageInputError(ValueError):
    """An image input that cannot be read; the message is meant for the client."""


def decode_data_url(url: str) -> Any:
    """A PIL image from a ``data:image/...;base64,...`` URL. Other schemes are refused: the
    server fetches nothing (the gateway fetches http(s) images under its own rules)."""
    from PIL import Image

    header, sep, payload = url.partition(",")
    if not header.startswith("data:"):
        scheme = url.split(":", 1)[0] if ":" in url else url[:16]
        raise ImageInputError(
            f"image URL scheme {scheme!r} is not served here: send images as data: URLs"
        )
    if not sep or not header.endswith(";base64"):
        raise ImageInputError("an image data: URL must be base64 encoded")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageInputError(f"the image data: URL is not valid base64: {exc}") from exc
    try:
        image = Image.open(io.BytesIO(raw))
        if image.width * image.height > MAX_PIXELS:
            raise ImageInputError(f"the image has more than {MAX_PIXELS} pixels")
        image.load()
    except (OSError, Image.DecompressionBombError) as exc:
        raise ImageInputError(f"the image cannot be decoded: {exc}") from exc
    return image.convert("RGB")


def images_from_urls(urls: npt.NDArray[Any]) -> list[Any]:
    """The images of one request's ``IMAGE_URL`` row (empty strings skipped)."""
    out = []
    for value in np.asarray(urls).reshape(-1):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        if text:
            out.append(decode_data_url(text))
    return out


def images_from_arrays(pixels: npt.NDArray[Any]) -> list[Any]:
    """The images of one request's ``IMAGE_BYTES`` row: ``[num_images, H, W, 3]`` or
    ``[num_images, 3, H, W]`` uint8."""
    from PIL import Image

    array = np.asarray(pixels)
    if array.ndim == 3:
        array = array[None]
    if array.ndim != 4:
        raise ImageInputError(f"IMAGE_BYTES must be [num_images, H, W, 3], got {array.shape}")
    if array.shape[-1] != 3 and array.shape[1] == 3:
        array = array.transpose(0, 2, 3, 1)
    if array.shape[-1] != 3:
        raise ImageInputError(f"IMAGE_BYTES must hold RGB images, got {array.shape}")
    return [Image.fromarray(np.ascontiguousarray(image.astype(np.uint8))) for image in array]


class ImageProcessor:
    """The checkpoint's Hugging Face image processor: images to ``[N, 3, H, W]`` pixels."""

    def __init__(self, model_dir: str) -> None:
        from transformers import AutoImageProcessor

        self.processor = AutoImageProcessor.from_pretrained(model_dir)

    def pixel_values(self, images: Sequence[Any]) -> npt.NDArray[np.float16]:
        """Pixel values of ``images`` (float16, the stock ``PIXEL_VALUES`` type)."""
        if not images:
            raise ImageInputError("no images to process")
        out = self.processor(images=list(images), return_tensors="np")
        pixels: npt.NDArray[np.float16] = np.asarray(out["pixel_values"]).astype(np.float16)
        return pixels
