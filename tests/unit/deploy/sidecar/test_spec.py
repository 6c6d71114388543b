"""The deploy spec: its files' relative paths, its validation, the sidecars that host a
pipeline, the text models' Python environment and the engine settings it carries to the
rendered configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.sidecar.render import RenderError, render_config, render_model, render_spec
from deploy.sidecar.spec import PIPELINE_MODELS, SpecError, load_spec, parse_spec
from tests.support.deploy_spec import TORCH, TRTLLM, one_model_spec, parse_config


def test_spec_file_relative_paths_and_two_sidecars(tmp_path: Path) -> None:
    (tmp_path / "models" / "a").mkdir(parents=True)
    (tmp_path / "spec.yaml").write_text(
        "models:\n"
        "  - {name: a, engine: {kind: torch, model_dir: ./models/a}}\n"
        "  - name: b\n"
        "    tokenizer_dir: ./models/a\n"
        "    engine: {kind: tensorrtllm, engine_dir: ./models/a}\n"
        "sidecars:\n  - {name: cpu, models: [a]}\n  - {name: gpu, models: [b]}\n"
    )
    spec = load_spec(tmp_path / "spec.yaml")
    assert spec.models[0].engine.model_dir == str(tmp_path / "models" / "a")  # type: ignore[union-attr]
    out = render_spec(spec, tmp_path / "out")
    assert sorted(p.name for p in out["cpu"].iterdir()) == sorted(f"a_{n}" for n in PIPELINE_MODELS)
    assert sorted(p.name for p in out["gpu"].iterdir()) == sorted(f"b_{n}" for n in PIPELINE_MODELS)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"models": []}, "serves no models"),
        ({"models": [{"name": "a b", "engine": TORCH}]}, "must match"),
        ({"models": [{"name": "a", "engine": TORCH}, {"name": "a", "engine": TORCH}]}, "twice"),
        ({"models": [{"name": "a", "engine": {"kind": "onnx"}}]}, "invalid spec"),
        ({"models": [{"name": "a", "engine": TORCH, "colour": 1}]}, "invalid spec"),
        (
            {"models": [{"name": "a", "engine": {**TORCH, "tokens_per_block": 0}}]},
            "tokens_per_block must be >= 1",
        ),
        (
            {"models": [{"name": "a", "engine": {**TORCH, "kv_cache_free_gpu_mem_fraction": 2.0}}]},
            r"must be in \(0, 1\]",
        ),
        (
            {"models": [{"name": "a", "engine": {**TORCH, "max_beam_width": 0}}]},
            "max_beam_width must be >= 1",
        ),
        (
            {"models": [{"name": "a", "engine": {**TORCH, "max_beam_width": 32}}]},
            "max_beam_width must not exceed max_batch_size",
        ),
        ({"models": [{"name": "a", "engine": TRTLLM}]}, None),
        (
            {"models": [{"name": "a", "engine": TORCH}], "sidecars": [{"models": ["zz"]}]},
            "no model named 'zz'",
        ),
        (
            {
                "models": [{"name": "a", "engine": TORCH}, {"name": "b", "engine": TORCH}],
                "sidecars": [{"name": "x", "models": ["a"]}, {"name": "y", "models": ["a"]}],
            },
            r"not hosted by any sidecar: \['b'\]",
        ),
        (
            {
                "models": [{"name": "a", "engine": TORCH}],
                "sidecars": [{"name": "x", "models": ["a"]}, {"name": "x", "models": ["a"]}],
            },
            "sidecar names must be unique",
        ),
        (
            {
                "models": [{"name": "a", "engine": TORCH}],
                "sidecars": [{"name": "x", "stop_grace_s": -1}],
            },
            "sidecar 'x': stop_grace_s must be >= 0",
        ),
    ],
)
def test_spec_validation(data: dict[str, object], message: str | None) -> None:
    if message is None:
        with pytest.raises(SpecError, match="tokenizer_dir is required"):
            render_model(parse_spec(data).models[0])
        return
    with pytest.raises(SpecError, match=message):
        parse_spec(data)


def test_a_pipeline_hosted_by_several_sidecars_is_served_by_each() -> None:
    spec = parse_spec(
        {
            "models": [{"name": "a", "engine": TORCH}],
            "sidecars": [{"name": "gpu0", "env": {"CUDA_VISIBLE_DEVICES": "0"}}, {"name": "gpu1"}],
        }
    )
    assert [[m.name for m in spec.models_of(s)] for s in spec.sidecars] == [["a"], ["a"]]


def test_text_python_env_goes_to_the_text_models_only(tmp_path: Path) -> None:
    env = tmp_path / "text-env"
    env.mkdir()
    spec = parse_spec(one_model_spec(TORCH, text_python_env=str(env)))
    files = render_model(spec.models[0])
    for name in PIPELINE_MODELS:
        config = parse_config(files[f"m1_{name}/config.pbtxt"])
        value = config.parameters.get("EXECUTION_ENV_PATH")
        expected = (
            str(env) if name in ("preprocessing", "postprocessing", "tensorrt_llm_bls") else None
        )
        assert (value.string_value if value is not None else None) == expected, name


def test_missing_text_python_env_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-env"
    spec = parse_spec(one_model_spec(TORCH, text_python_env=str(missing)))
    with pytest.raises(RenderError, match=f"text_python_env {missing} does not exist"):
        render_spec(spec, tmp_path / "out")


def test_relative_text_python_env_is_taken_from_the_spec_file(tmp_path: Path) -> None:
    (tmp_path / "envs" / "text").mkdir(parents=True)
    path = tmp_path / "spec.yaml"
    path.write_text(
        "models:\n  - name: m\n    engine: {kind: torch, model_dir: some/id}\n"
        "    text_python_env: ./envs/text\n"
    )
    assert load_spec(path).models[0].text_python_env == str(tmp_path / "envs" / "text")


def test_grammar_compile_settings_reach_the_engine() -> None:
    from google.protobuf import json_format

    from deploy.triton.engine.config import settings_from_model_config
    from deploy.triton.engine.types import EngineConfig, EngineError, GuidedConfig

    def guided(**settings: object) -> tuple[GuidedConfig | None, dict[str, object]]:
        spec = one_model_spec({**TORCH, **settings}, release="latest")
        config = parse_config(render_config(parse_spec(spec).models[0], "tensorrt_llm"))
        document = json_format.MessageToDict(config, preserving_proto_field_name=True)
        read = settings_from_model_config(document).engine
        assert isinstance(read, EngineConfig)
        return read.guided, document

    chosen, document = guided(
        guided_decoding_compile_timeout_ms=250,
        guided_decoding_max_compiles=3,
        guided_decoding_cache_mb=64,
    )
    assert chosen == GuidedConfig(compile_timeout_ms=250, max_compiles=3, cache_mb=64)
    assert guided()[0] == GuidedConfig()
    document["parameters"]["guided_decoding_max_compiles"] = {"string_value": "0"}  # type: ignore[index]
    with pytest.raises(EngineError, match="guided_decoding_max_compiles must be at least 1"):
        settings_from_model_config(document)
