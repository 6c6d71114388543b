"""Session fixtures: the tiny test model and a real tritonserver sidecar hosting two pipelines."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.sidecar.spec import Spec, parse_spec
from deploy.sidecar.supervisor import Sidecar, sidecar_from_spec

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The deterministic tiny Llama with its byte-level BPE tokenizer and ChatML template."""
    from deploy.sidecar.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def tiny_spec(model_dir: Path, **sidecar: object) -> Spec:
    """Two pipelines over the tiny model.

    ``tiny``: the newest layout (token-count tensors, ``min_tokens``/``seed``); BLS deltas; an
    engine LoRA cache of one adapter.
    ``tiny2``: the v0.19 layout (no token counts, ``min_length``/``random_seed``); BLS streams
    cumulative text.
    ``tiny3``: the v0.8 layout, not decoupled.
    """
    engine = {"kind": "torch", "model_dir": str(model_dir), "max_batch_size": 16}
    return parse_spec(
        {
            "models": [
                {
                    "name": "tiny",
                    "release": "latest",
                    "engine": {**engine, "lora_cache_size": 1},
                    "bls_instances": 1,
                },
                {
                    "name": "tiny2",
                    "release": "v0.19",
                    "engine": engine,
                    "accumulate_tokens": True,
                },
                {"name": "tiny3", "release": "v0.8", "engine": engine, "decoupled": False},
            ],
            "sidecars": [{"name": "tiny", **sidecar}],
        }
    )


@pytest.fixture(scope="session")
def sidecar(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A running tritonserver hosting all five models of ``tiny`` and of ``tiny2``."""
    spec = tiny_spec(tiny_model_dir)
    server = sidecar_from_spec(spec, spec.sidecars[0], tmp_path_factory.mktemp("sidecar"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The PEFT LoRA adapters of ``tests/lora_fixtures.RECIPES`` on the tiny model."""
    from tests.lora_fixtures import RECIPES, make_peft_adapter

    root = tmp_path_factory.mktemp("peft")
    return {
        name: make_peft_adapter(tiny_model_dir, root / name, recipe)
        for name, recipe in RECIPES.items()
    }
