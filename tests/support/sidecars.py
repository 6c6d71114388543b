"""The tiny model's deploy spec that the shared test sidecar serves."""

from __future__ import annotations

from pathlib import Path

from deploy.sidecar.spec import Spec, parse_spec

CHUNK_TOKENS = 64
"""``tiny2``'s ``max_num_tokens``: prompt tokens prefilled per iteration, in chunks."""
CHUNKED = {"enable_chunked_context": True, "max_num_tokens": CHUNK_TOKENS, "tokens_per_block": 16}
MAX_BEAM_WIDTH = 4
QUICK_STOP = {"stop_grace_s": 0}
"""For a test's sidecar: killed on stop (its shared memory removed) rather than given seconds to
unload its models; the supervisor's tests keep the graceful stop."""
SMALL_KV_CACHE = 8192
"""Tokens of ``tiny3``'s KV cache: two sequences of the tiny model's 4096."""


def tiny_spec(model_dir: Path, **sidecar: object) -> Spec:
    """Two pipelines over the tiny model.

    ``tiny``: the newest layout (token-count tensors, ``min_tokens``/``seed``); BLS deltas; an
    engine LoRA cache of one adapter.
    ``tiny2``: the v0.19 layout (no token counts, ``min_length``/``random_seed``); BLS streams
    cumulative text; chunked context of at most 64 prompt tokens an iteration, blocks of 16.
    ``tiny3``: the v0.8 layout, not decoupled; a KV cache of two full-length sequences.
    Every engine reuses cached prefixes (the engine's default) and searches up to 4 beams.
    """
    engine = {
        "kind": "torch",
        "model_dir": str(model_dir),
        "max_batch_size": 16,
        "max_beam_width": MAX_BEAM_WIDTH,
    }
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
                    "engine": {**engine, **CHUNKED},
                    "accumulate_tokens": True,
                },
                {
                    "name": "tiny3",
                    "release": "v0.8",
                    "engine": {**engine, "max_tokens_in_paged_kv_cache": SMALL_KV_CACHE},
                    "decoupled": False,
                },
            ],
            "sidecars": [{"name": "tiny", **QUICK_STOP, **sidecar}],
        }
    )
