"""What a Llava-style checkpoint's ``config.json`` says about its images (torch-free)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_IMAGE_TOKEN = "<image>"


class VisionConfigError(ValueError):
    """A checkpoint whose vision settings cannot be used."""


@dataclass(frozen=True)
class VisionSettings:
    """How many feature rows an image becomes and which token marks where it goes."""

    image_token_id: int
    tokens_per_image: int
    vocab_size: int
    """The language model's vocabulary: placeholder ids start here."""


def tokens_per_image(config: dict[str, Any]) -> int:
    """Feature rows per image of a Llava config: one per patch, plus the class token when
    ``vision_feature_select_strategy`` is ``full``."""
    vision = config.get("vision_config") or {}
    image_size, patch_size = vision.get("image_size"), vision.get("patch_size")
    if not isinstance(image_size, int) or not isinstance(patch_size, int) or patch_size <= 0:
        raise VisionConfigError("vision_config needs integer image_size and patch_size")
    patches = (image_size // patch_size) ** 2
    full = config.get("vision_feature_select_strategy", "default") == "full"
    return patches + (1 if full else 0)


def read_settings(model_dir: str | Path) -> VisionSettings | None:
    """The vision settings of the checkpoint in ``model_dir``; None for a text-only model."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config.get("vision_config"), dict):
        return None
    token = config.get("image_token_id", config.get("image_token_index"))
    text = config.get("text_config") or {}
    vocab = text.get("vocab_size", config.get("vocab_size"))
    if not isinstance(token, int) or not isinstance(vocab, int):
        raise VisionConfigError(f"{path}: image_token_id and text_config.vocab_size are needed")
    return VisionSettings(token, tokens_per_image(config), vocab)
