"""The tiny model's deploy spec that the shared test sidecar serves."""

from __future__ import annotations

from pathlib import Path

from deploy.sidecar.spec import Spec, parse_spec


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
