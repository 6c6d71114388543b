"""Session fixtures: the tiny test model and a real tritonserver sidecar hosting two pipelines."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.spec import Spec, parse_spec
from deploy.supervisor import Sidecar, sidecar_from_spec

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The deterministic tiny Llama with its byte-level BPE tokenizer and ChatML template."""
    from deploy.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def tiny_spec(model_dir: Path, **sidecar: object) -> Spec:
    """Two pipelines over the tiny model.

    ``tiny``: BLS streams deltas, token-count tensors declared (newer TensorRT-LLM releases).
    ``tiny2``: BLS streams cumulative text, no token-count tensors (older releases).
    """
    engine = {"kind": "torch", "model_dir": str(model_dir), "max_batch_size": 16}
    return parse_spec(
        {
            "models": [
                {"name": "tiny", "engine": engine, "bls_instances": 1},
                {
                    "name": "tiny2",
                    "engine": engine,
                    "accumulate_tokens": True,
                    "token_counts": False,
                },
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
