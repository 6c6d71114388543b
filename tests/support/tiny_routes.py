"""The tiny model's route for unit tests that load its tokenizer and never reach its Triton."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from adapters.contract import ModelTarget
from gateway.catalog.registry import ModelRoute
from gateway.settings import SamplingDefaults


def tiny_route(tokenizer_dir: Path, **changes: Any) -> ModelRoute:
    """The tiny model served from ``tokenizer_dir`` as ``tiny`` (its ensemble at an address
    nothing listens on), with ``changes`` to any of its settings."""
    route = ModelRoute(
        name="tiny",
        target=ModelTarget(url="127.0.0.1:1", triton_model="tiny_ensemble", kind="ensemble"),
        tokenizer_dir=str(tokenizer_dir),
        chat_template_file=None,
        context_length=256,
        add_special_tokens=True,
        max_n=4,
        defaults=SamplingDefaults(),
        owned_by="me",
    )
    return dataclasses.replace(route, **changes)
