"""A served model's tokenizer, from a folder, a built-in model name or a Hugging Face hub id.

The folder is read without ``transformers`` (``deploy.triton.pipeline.tokenizer_folder``, shared
with the pipeline's preprocessing and postprocessing models).
"""

from __future__ import annotations

from pathlib import Path

from deploy.triton.pipeline.tokenizer_folder import (
    TOKENIZER_FILES,
    HubTokenizer,
    TextTokenizer,
    load_folder,
)

__all__ = ["HubTokenizer", "TextTokenizer", "load_tokenizer"]


def load_tokenizer(name_or_path: str) -> TextTokenizer:
    """The tokenizer of a folder, a built-in model name (``tiny``, ``smollm2``) or a hub id."""
    return load_folder(_folder(name_or_path))


def _folder(name_or_path: str) -> Path:
    from deploy.sidecar.models import resolve_model_dir

    path = Path(resolve_model_dir(name_or_path))
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name_or_path, allow_patterns=list(TOKENIZER_FILES)))
