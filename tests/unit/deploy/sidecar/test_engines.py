"""What each engine kind of a deploy spec finds wrong with its own values."""

from __future__ import annotations

import msgspec
import pytest

from deploy.sidecar.engines import LoadTestEngine, TorchEngine
from deploy.sidecar.spec import SpecError, parse_spec


@pytest.mark.parametrize(
    ("values", "problems"),
    [
        ({}, []),
        (
            {"max_batch_size": 0},
            [
                "engine max_batch_size must be >= 1",
                "engine max_beam_width must not exceed max_batch_size",
            ],
        ),
        ({"max_num_tokens": 0}, ["engine max_num_tokens must be >= 1"]),
        (
            {"max_tokens_in_paged_kv_cache": -4},
            ["engine max_tokens_in_paged_kv_cache must be >= 1"],
        ),
        ({"max_beam_width": 17}, ["engine max_beam_width must not exceed max_batch_size"]),
        (
            {"kv_cache_free_gpu_mem_fraction": 0.0},
            ["engine kv_cache_free_gpu_mem_fraction must be in (0, 1]"],
        ),
        ({"kv_cache_free_gpu_mem_fraction": 1.0}, []),
        (
            {"tokens_per_block": 0, "max_beam_width": 0},
            ["engine tokens_per_block must be >= 1", "engine max_beam_width must be >= 1"],
        ),
    ],
)
def test_torch_engine_problems(values: dict[str, object], problems: list[str]) -> None:
    assert TorchEngine(model_dir="tiny", **values).problems() == problems  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "problems"),
    [
        ({}, []),
        ({"token_id": 5, "token_s": 0.0125, "prompt_token_s": 0.001}, []),
        ({"token_id": -1}, ["engine token_id must be >= 0"]),
        ({"prompt_token_s": -0.5}, ["engine token_s and prompt_token_s must be >= 0"]),
        ({"senders": 0}, ["engine max_batch_size, instances and senders must be >= 1"]),
        (
            {"token_s": -1.0, "instances": 0},
            [
                "engine token_s and prompt_token_s must be >= 0",
                "engine max_batch_size, instances and senders must be >= 1",
            ],
        ),
    ],
)
def test_load_test_engine_problems(values: dict[str, object], problems: list[str]) -> None:
    assert LoadTestEngine(tokenizer_dir="tiny", **values).problems() == problems  # type: ignore[arg-type]


def test_a_spec_names_the_model_whose_engine_is_wrong() -> None:
    engine = msgspec.to_builtins(LoadTestEngine(tokenizer_dir="tiny", senders=0))
    with pytest.raises(SpecError, match="model 'paced': engine max_batch_size, instances and"):
        parse_spec({"models": [{"name": "paced", "engine": engine}]})
