"""Image tokens in a prompt replaced by placeholder ids, as TensorRT-LLM's preprocessing does:
image k of a prompt takes ids ``vocab_size + k * T ... vocab_size + (k + 1) * T - 1``, which
the engine replaces by rows of the prompt table (torch-free)."""

from __future__ import annotations

from collections.abc import Sequence

from deploy.triton.vision.settings import VisionSettings


class ImageCountError(ValueError):
    """A prompt whose image tokens do not match the images sent with it."""


def count_images(ids: Sequence[int], settings: VisionSettings) -> int:
    """How many image tokens a tokenized prompt holds."""
    return sum(1 for token in ids if token == settings.image_token_id)


def expand(ids: Sequence[int], images: int, settings: VisionSettings) -> list[int]:
    """``ids`` with each image token replaced by its image's placeholder ids."""
    found = count_images(ids, settings)
    if found != images:
        raise ImageCountError(
            f"the prompt holds {found} image token(s) but {images} image(s) were sent"
        )
    out: list[int] = []
    start = settings.vocab_size
    for token in ids:
        if token != settings.image_token_id:
            out.append(int(token))
            continue
        out.extend(range(start, start + settings.tokens_per_image))
        start += settings.tokens_per_image
    return out
