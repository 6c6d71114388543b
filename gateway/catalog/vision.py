"""Whether a served model takes images, read from its checkpoint's ``config.json`` as the
pipeline reads it: a Llava-style ``vision_config``, how many prompt tokens each image becomes
and the token that marks where an image goes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deploy.triton.vision.settings import VisionConfigError, read_settings
from gateway.settings import ImageSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class VisionInputs:
    """A model's image inputs: the tokens each image takes in the prompt, its image token,
    and the rules."""

    tokens_per_image: int
    image_token_id: int
    image_token: str
    """The image token as text (``<image>``): typed in a message, it is refused."""
    settings: ImageSettings


def read_vision(
    model_dir: str, settings: ImageSettings, token_text: Callable[[int], str]
) -> VisionInputs | None:
    """The image inputs of the checkpoint in ``model_dir`` (``token_text`` spells a token id);
    None for a text-only model or a folder that is not here to read."""
    try:
        found = read_settings(Path(model_dir).expanduser())
    except (VisionConfigError, AttributeError) as error:
        logger.warning("%s: the vision settings cannot be used (%s); text only", model_dir, error)
        return None
    if found is None:
        return None
    token = found.image_token_id
    return VisionInputs(found.tokens_per_image, token, token_text(token), settings)
