"""Sidecars that run one phase of disaggregated requests: the spec's phases and KV-cache
transfer settings, what it refuses, and the settings each sidecar's engine is rendered with."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format

from deploy.sidecar.render import render_files
from deploy.sidecar.spec import SpecError, parse_spec
from deploy.triton.engine.config import settings_from_model_config
from deploy.triton.engine.types import EngineConfig
from tests.support.deploy_spec import TORCH, TRTLLM, parse_config

CONTEXT = {
    "name": "ctx",
    "env": {"CUDA_VISIBLE_DEVICES": "0"},
    "disaggregation": {
        "phase": "context",
        "kv_transfer_timeout_ms": 5000,
        "max_tokens_in_paged_kv_cache": 8192,
    },
}
GENERATION = {
    "name": "gen",
    "env": {"CUDA_VISIBLE_DEVICES": "1"},
    "disaggregation": {"phase": "generation", "kv_cache_free_gpu_mem_fraction": 0.4},
}


def _split_spec(*sidecars: dict[str, Any], engine: dict[str, Any] = TORCH, **model: Any) -> Any:
    pipeline = {"name": "m1", "tokenizer_dir": "tok/id", "engine": engine, **model}
    return {"models": [pipeline], "sidecars": list(sidecars or (CONTEXT, GENERATION))}


def _engine(spec: Any, sidecar: str) -> EngineConfig:
    parsed = parse_spec(spec)
    (sidecar_spec,) = [s for s in parsed.sidecars if s.name == sidecar]
    text = render_files(parsed, sidecar_spec)["m1_tensorrt_llm/config.pbtxt"]
    document = json_format.MessageToDict(parse_config(text), preserving_proto_field_name=True)
    engine = settings_from_model_config(document).engine
    assert isinstance(engine, EngineConfig)
    return engine


def test_a_context_and_a_generation_sidecar_each_run_their_own_kv_cache_settings() -> None:
    spec = _split_spec(engine={**TORCH, "kv_transfer_timeout_ms": 9000})
    parsed = parse_spec(spec)
    assert [s.disaggregation.phase for s in parsed.sidecars if s.disaggregation] == [
        "context",
        "generation",
    ]
    assert parsed.sidecars[1].env == {"CUDA_VISIBLE_DEVICES": "1"}
    context, generation = _engine(spec, "ctx"), _engine(spec, "gen")
    assert context.kv_transfer_timeout_ms == 5000
    assert context.kv_cache.max_tokens == 8192
    # What a sidecar leaves unset is the engine's own setting.
    assert generation.kv_transfer_timeout_ms == 9000
    assert generation.kv_cache.free_gpu_mem_fraction == 0.4
    assert generation.kv_cache.max_tokens is None


def test_a_sidecar_without_a_phase_renders_the_engine_as_the_spec_writes_it() -> None:
    spec = {"models": [{"name": "m1", "tokenizer_dir": "tok/id", "engine": TORCH}]}
    assert _engine(spec, "main").kv_transfer_timeout_ms == EngineConfig.kv_transfer_timeout_ms


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            _split_spec(engine={"kind": "loadtest", "tokenizer_dir": "tok/id"}),
            "sidecar 'ctx' runs the context phase of disaggregated requests, which needs the "
            "tensorrt_llm model of a torch engine on both sides; model 'm1' has a loadtest engine",
        ),
        (_split_spec(engine=TRTLLM), "model 'm1' has a tensorrtllm engine"),
        (_split_spec(release="v0.11"), "needs release v0.19 or latest"),
        (_split_spec(CONTEXT), "model 'm1' has no generation sidecar"),
        (
            _split_spec({**GENERATION, "name": "g0"}, GENERATION),
            "model 'm1' has no context sidecar",
        ),
        (
            _split_spec(CONTEXT, GENERATION, {"name": "plain"}),
            "model 'm1' runs on sidecars with and without a disaggregation phase",
        ),
        (
            _split_spec({**CONTEXT, "disaggregation": {"phase": "prefill"}}, GENERATION),
            "invalid spec",
        ),
        (
            _split_spec(
                {**CONTEXT, "disaggregation": {"phase": "context", "kv_transfer_timeout_ms": 0}},
                GENERATION,
            ),
            "sidecar 'ctx': disaggregation.kv_transfer_timeout_ms must be >= 1",
        ),
        (
            _split_spec(
                CONTEXT,
                {
                    **GENERATION,
                    "disaggregation": {"phase": "generation", "max_tokens_in_paged_kv_cache": 0},
                },
            ),
            "disaggregation.max_tokens_in_paged_kv_cache must be >= 1",
        ),
        (
            _split_spec(
                CONTEXT,
                {
                    **GENERATION,
                    "disaggregation": {"phase": "generation", "kv_cache_free_gpu_mem_fraction": 0},
                },
            ),
            r"kv_cache_free_gpu_mem_fraction must be in \(0, 1\]",
        ),
    ],
)
def test_a_split_the_sidecars_cannot_run_is_refused(spec: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(spec)


def test_a_phase_applies_to_the_pipelines_of_its_sidecar_only() -> None:
    spec = {
        "models": [
            {"name": "m1", "tokenizer_dir": "tok/id", "engine": TORCH},
            {"name": "lt", "engine": {"kind": "loadtest", "tokenizer_dir": "tok/id"}},
        ],
        "sidecars": [
            {**CONTEXT, "models": ["m1"]},
            {**GENERATION, "models": ["m1"]},
            {"name": "bench", "models": ["lt"]},
        ],
    }
    assert [s.name for s in parse_spec(spec).sidecars] == ["ctx", "gen", "bench"]


ONE_GPU = {"CUDA_VISIBLE_DEVICES": "0"}


def test_two_phases_on_one_gpu_each_need_their_share_of_its_memory() -> None:
    unsized = {**GENERATION, "env": ONE_GPU, "disaggregation": {"phase": "generation"}}
    shared = _split_spec({**CONTEXT, "env": ONE_GPU}, unsized)
    with pytest.raises(SpecError) as refused:
        parse_spec(shared)
    assert str(refused.value) == (
        "sidecars ['ctx', 'gen'] share CUDA_VISIBLE_DEVICES 0: give ['gen'] "
        "disaggregation.max_tokens_in_paged_kv_cache (or kv_cache_free_gpu_mem_fraction), "
        "each sidecar's share of the memory"
    )
    sized = {"phase": "generation", "max_tokens_in_paged_kv_cache": 65536}
    parse_spec(
        _split_spec(
            {**CONTEXT, "env": ONE_GPU}, {**GENERATION, "env": ONE_GPU, "disaggregation": sized}
        )
    )
    # On the CPU there is no GPU memory to share.
    on_cpu = _split_spec({**CONTEXT, "env": ONE_GPU}, unsized, engine={**TORCH, "device": "cpu"})
    parse_spec(on_cpu)
