"""Rendering: stock I/O preserved, prefixed names wired through, placeholders and paths checked."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from deploy.render import RenderError, fill, render_config, render_model, render_spec
from deploy.spec import PIPELINE_MODELS, SpecError, load_spec, parse_spec

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "stock-configs"
PACKAGED = Path(__file__).resolve().parents[1] / "deploy" / "templates"
STOCK = REFERENCE if REFERENCE.is_dir() else PACKAGED

TORCH = {"kind": "torch", "model_dir": "some/hub-id"}
TRTLLM = {"kind": "tensorrtllm", "engine_dir": "/engines/llama", "gpu_device_ids": "0,1"}


def _spec(engine: dict[str, object], **model: object) -> dict[str, object]:
    return {"models": [{"name": "m1", "tokenizer_dir": "tok/id", "engine": engine, **model}]}


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def stock_config(name: str) -> mc.ModelConfig:
    """The stock config with its typed placeholders filled as the stock fill_template docs do."""
    text = string.Template((STOCK / name / "config.pbtxt").read_text()).safe_substitute(
        triton_max_batch_size="64",
        decoupled_mode="true",
        logits_datatype="TYPE_FP32",
        encoder_input_features_data_type="TYPE_FP16",
        prompt_embedding_table_data_type="TYPE_FP16",
        preprocessing_instance_count="1",
        postprocessing_instance_count="1",
        bls_instance_count="1",
        max_queue_delay_microseconds="0",
        max_queue_size="0",
        triton_backend="python",
    )
    return parse(text)


def io_signature(config: mc.ModelConfig) -> dict[str, list[tuple[object, ...]]]:
    def entries(tensors: object) -> list[tuple[object, ...]]:
        return sorted(
            (
                t.name,
                mc.DataType.Name(t.data_type),
                tuple(t.dims),
                getattr(t, "optional", False),
                getattr(t, "allow_ragged_batch", False),
                tuple(t.reshape.shape) if t.HasField("reshape") else None,
            )
            for t in tensors  # type: ignore[attr-defined]
        )

    return {"input": entries(config.input), "output": entries(config.output)}


@pytest.mark.parametrize("engine", [TORCH, TRTLLM], ids=["torch", "tensorrtllm"])
@pytest.mark.parametrize("name", PIPELINE_MODELS)
def test_rendered_io_equals_stock_io(engine: dict[str, object], name: str) -> None:
    model = parse_spec(_spec(engine, token_counts=False)).models[0]
    rendered = parse(render_config(model, name))
    assert io_signature(rendered) == io_signature(stock_config(name))
    assert rendered.max_batch_size == 64


COUNT_IO = {
    "ensemble": (
        [("return_num_input_tokens", "TYPE_BOOL", (1,), True, False, None)],
        [("num_input_tokens", "TYPE_INT32", (1,), False, False, None)],
    ),
    "tensorrt_llm": (
        [("return_num_input_tokens", "TYPE_BOOL", (1,), True, False, ())],
        [("num_input_tokens", "TYPE_INT32", (1,), False, False, None)],
    ),
}
COUNT_IO["tensorrt_llm_bls"] = COUNT_IO["tensorrt_llm"]


@pytest.mark.parametrize("name", PIPELINE_MODELS)
def test_token_counts_add_exactly_the_newer_release_tensors(name: str) -> None:
    model = parse_spec(_spec(TORCH)).models[0]
    rendered, stock = (
        io_signature(parse(render_config(model, name))),
        io_signature(stock_config(name)),
    )
    added_in = sorted(set(rendered["input"]) - set(stock["input"]))
    added_out = sorted(set(rendered["output"]) - set(stock["output"]))
    assert set(stock["input"]) <= set(rendered["input"])
    assert set(stock["output"]) <= set(rendered["output"])
    if name not in COUNT_IO:
        assert added_in == added_out == []
        return
    flag, count = COUNT_IO[name][0][0], COUNT_IO[name][1][0]
    assert added_in == [flag, (flag[0].replace("input", "output"), *flag[1:])]
    assert added_out == [count, (count[0].replace("input", "output"), *count[1:])]


def test_ensemble_routes_token_counts_through_the_engine_step() -> None:
    model = parse_spec(_spec(TORCH)).models[0]
    step = parse(render_config(model, "ensemble")).ensemble_scheduling.step[1]
    assert step.model_name == "m1_tensorrt_llm"
    assert step.input_map["return_num_output_tokens"] == "return_num_output_tokens"
    assert step.output_map["num_output_tokens"] == "num_output_tokens"


@pytest.mark.parametrize("engine", [TORCH, TRTLLM], ids=["torch", "tensorrtllm"])
def test_names_are_prefixed_and_wired(engine: dict[str, object]) -> None:
    model = parse_spec(_spec(engine)).models[0]
    configs = {name: parse(render_config(model, name)) for name in PIPELINE_MODELS}
    assert {c.name for c in configs.values()} == {f"m1_{n}" for n in PIPELINE_MODELS}
    steps = [s.model_name for s in configs["ensemble"].ensemble_scheduling.step]
    assert steps == ["m1_preprocessing", "m1_tensorrt_llm", "m1_postprocessing"]
    bls = configs["tensorrt_llm_bls"].parameters
    assert bls["tensorrt_llm_model_name"].string_value == "m1_tensorrt_llm"
    assert bls["preprocessing_model_name"].string_value == "m1_preprocessing"
    assert bls["postprocessing_model_name"].string_value == "m1_postprocessing"
    assert configs["preprocessing"].parameters["tokenizer_dir"].string_value == "tok/id"


def test_torch_engine_config() -> None:
    spec = _spec({**TORCH, "device": "cuda:1", "dtype": "bfloat16", "max_batch_size": 8})
    config = parse(render_config(parse_spec(spec).models[0], "tensorrt_llm"))
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert config.backend == "python"
    assert config.model_transaction_policy.decoupled is True
    assert params["gpt_model_path"] == "some/hub-id"
    assert params["torch_device"] == "cuda:1"
    assert params["torch_dtype"] == "bfloat16"
    assert params["torch_max_batch_size"] == "8"
    assert not any("${" in v for v in params.values())


def test_tensorrtllm_engine_config_keeps_only_set_parameters() -> None:
    spec = _spec(
        {**TRTLLM, "kv_cache_free_gpu_mem_fraction": 0.5, "parameters": {"decoding_mode": "top_p"}}
    )
    config = parse(render_config(parse_spec(spec).models[0], "tensorrt_llm"))
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert config.backend == "tensorrtllm"
    assert params["gpt_model_path"] == "/engines/llama"
    assert params["gpu_device_ids"] == "0,1"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.5"
    assert params["decoding_mode"] == "top_p"
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert "lora_prefetch_dir" not in params  # unset -> dropped -> the backend default applies
    assert "torch_device" not in params


def test_repository_files() -> None:
    files = render_model(parse_spec(_spec(TORCH)).models[0])
    for name in ("preprocessing", "postprocessing", "tensorrt_llm_bls", "tensorrt_llm"):
        assert "TritonPythonModel" in files[f"m1_{name}/1/model.py"]
    assert "m1_ensemble/1/.keep" in files
    trt = render_model(parse_spec(_spec(TRTLLM)).models[0])
    assert "m1_tensorrt_llm/1/model.py" not in trt
    assert "m1_tensorrt_llm/1/.keep" in trt


def test_values_are_escaped_for_pbtxt() -> None:
    spec = _spec({**TORCH, "model_dir": 'C:\\models\\"odd"'})
    config = parse(render_config(parse_spec(spec).models[0], "tensorrt_llm"))
    assert config.parameters["gpt_model_path"].string_value == 'C:\\models\\"odd"'


def test_unresolved_placeholder_is_named() -> None:
    with pytest.raises(RenderError, match=r"unresolved placeholder.*bogus_value"):
        fill("max_batch_size: ${bogus_value}\n", {}, where="x")
    assert (
        fill('parameters {\n key: "a"\n value: { string_value: "${a}" }\n}\n', {}, where="x") == ""
    )


def test_missing_model_dir_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    spec = parse_spec(
        {"models": [{"name": "m", "engine": {"kind": "torch", "model_dir": str(missing)}}]}
    )
    with pytest.raises(RenderError, match=f"engine.model_dir {missing} does not exist"):
        render_spec(spec, tmp_path / "out")


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
        ({"models": [{"name": "a", "engine": TRTLLM}]}, None),
        (
            {"models": [{"name": "a", "engine": TORCH}], "sidecars": [{"models": ["zz"]}]},
            "no model named 'zz'",
        ),
        (
            {
                "models": [{"name": "a", "engine": TORCH}],
                "sidecars": [{"name": "x", "models": ["a"]}, {"name": "y", "models": ["a"]}],
            },
            "hosted by both",
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
