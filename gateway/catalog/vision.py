"""Whether a served model takes images, read from its checkpoint's ``config.json``: a
Llava-style ``vision_config`` and how many prompt tokens each image becomes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gateway.settings import ImageSettings


@dataclass(frozen=True, slots=True)
class VisionInputs:
    """A model's image inputs: the tokens each image takes in the prompt, and the rules."""

    tokens_per_image: int
    settings: ImageSettings


def read_vision(model_dir: str, settings: ImageSettings) -> VisionInputs | None:
    """The image inputs of the checkpoint in ``model_dir``; None for a text-only model or a
    folder that is not here to read."""
    try:
        config = json.loads((Path(model_dir).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    vision = config.get("vision_config") if isinstance(config, dict) else None
    if not isinstance(vision, dict):
        return None
    image_size, patch_size = vision.get("image_size"), vision.get("patch_size")
    if not isinstance(image_size, int) or not isinstance(patch_size, int) or patch_size < 1:
        return None
    tokens = (image_size // patch_size) ** 2
    if config.get("vision_feature_select_strategy", "default") == "full":
        tokens += 1
    return VisionInputs(tokens, settings)
