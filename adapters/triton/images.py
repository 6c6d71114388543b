"""A prompt's images as Triton inputs: ``image_url_input`` data URLs for an ensemble or BLS that
declares it (a pipeline with a ``multimodal_encoders`` model)."""

from __future__ import annotations

import base64
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from adapters.contract import InvalidRequest, PromptImage
from adapters.triton.config import ModelInputs


def check_images(model: ModelInputs) -> None:
    """Refuse images for a Triton model that cannot take them."""
    if model.is_engine:
        raise InvalidRequest(
            "This model takes no images.",
            param="messages",
            detail=f"Triton model {model.name} is the engine itself, which takes no images: "
            "serve this model through its ensemble or BLS (entry ensemble or tensorrt_llm_bls)",
        )
    if "image_url_input" not in model.accepted:
        raise InvalidRequest(
            "This model takes no images.",
            param="messages",
            detail=f"Triton model {model.name} declares no image_url_input",
        )


def image_urls(images: Sequence[PromptImage]) -> npt.NDArray[np.object_]:
    """``image_url_input`` ``[1, N]``: each image as a base64 ``data:`` URL, in prompt order."""
    urls = [
        f"data:{image.media_type};base64,{base64.b64encode(image.data).decode()}".encode()
        for image in images
    ]
    return np.array([urls], dtype=object)
