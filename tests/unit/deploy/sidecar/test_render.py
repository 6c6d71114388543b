"""Rendering: stock I/O preserved, prefixed names wired through, placeholders and paths checked."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from deploy.sidecar.render import RenderError, fill, render_config, render_model, render_spec
from deploy.sidecar.spec import PIPELINE_MODELS, parse_spec
from tests.support import REPO
from tests.support.deploy_spec import TORCH, TRTLLM, one_model_spec, parse_config

SHARED = REPO.parent / "shared" / "reference"
PACKAGED = REPO / "deploy" / "sidecar" / "templates"
RELEASES = ("v0.8", "v0.11", "v0.19", "latest")


def reference_template(release: str, name: str) -> Path:
    """The stock template a release's rendering must match, from ../shared when present.

    ``latest`` is checked against the configs of TensorRT-LLM's main branch of May 2025
    (``stock-configs``: ``min_tokens``/``seed``), to which ``LATEST_ADDITIONS`` adds the rest.
    """
    if release == "latest":
        folder = SHARED / "stock-configs"
    else:
        folder = SHARED / "stock-models" / f"{release}.0"
    if not folder.is_dir():
        pytest.skip(f"{folder} is not present beside the checkout")
    return folder / name / "config.pbtxt"


def stock_config(release: str, name: str) -> mc.ModelConfig:
    """The stock config with its typed placeholders filled as the stock fill_template docs do."""
    text = string.Template(reference_template(release, name).read_text()).safe_substitute(
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
    return parse_config(text)


Entry = tuple[object, ...]


def io_signature(config: mc.ModelConfig) -> dict[str, list[Entry]]:
    def entries(tensors: object) -> list[Entry]:
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


def _counts(reshape: tuple[int, ...] | None) -> dict[str, list[Entry]]:
    flags = [
        (f"return_num_{kind}_tokens", "TYPE_BOOL", (1,), True, False, reshape)
        for kind in ("input", "output")
    ]
    counts = [
        (f"num_{kind}_tokens", "TYPE_INT32", (1,), False, False, None)
        for kind in ("input", "output")
    ]
    return {"input": flags, "output": counts}


def _salt(reshape: tuple[int, ...] | None) -> Entry:
    return ("cache_salt_id", "TYPE_UINT64", (1,), True, False, reshape)


# A generation-only request's KV-cache handoff, under return_perf_metrics.
_TRANSFER: list[Entry] = [
    ("kv_cache_transfer_ms", "TYPE_FP32", (1,), False, False, None),
    ("kv_cache_transfer_blocks", "TYPE_INT32", (1,), False, False, None),
    ("kv_cache_size", "TYPE_INT64", (1,), False, False, None),
]

# TensorRT-LLM 1.x over the May 2025 main branch: token counts (PR #5445), pixtral image sizes,
# the executor's per-request ``cache_salt_id``.
LATEST_ADDITIONS: dict[str, dict[str, list[Entry]]] = {
    "ensemble": {
        "input": [*_counts(None)["input"], _salt(None)],
        "output": _counts(None)["output"],
    },
    "tensorrt_llm": {
        "input": [*_counts(())["input"], _salt(())],
        "output": [*_counts(())["output"], *_TRANSFER],
    },
    "tensorrt_llm_bls": {
        "input": [
            *_counts(())["input"],
            _salt(()),
            ("image_sizes_input", "TYPE_INT64", (-1, 2), True, False, None),
        ],
        "output": _counts(())["output"],
    },
    "preprocessing": {"input": [("IMAGE_SIZES", "TYPE_INT64", (-1, 2), True, False, None)]},
}
# ... and two changed dims: IMAGE_URL input [1] -> [-1], IMAGE_SIZES output [2] -> [-1, 2].
LATEST_CHANGES = {
    ("preprocessing", "input", "IMAGE_URL"): (-1,),
    ("preprocessing", "output", "IMAGE_SIZES"): (-1, 2),
}


def expected_io(release: str, name: str) -> dict[str, list[Entry]]:
    signature = io_signature(stock_config(release, name))
    if release != "latest":
        return signature
    for side in ("input", "output"):
        changed = [
            (e[0], e[1], LATEST_CHANGES.get((name, side, str(e[0])), e[2]), *e[3:])
            for e in signature[side]
        ]
        signature[side] = sorted(changed + LATEST_ADDITIONS.get(name, {}).get(side, []))
    return signature


@pytest.mark.parametrize("engine", [TORCH, TRTLLM], ids=["torch", "tensorrtllm"])
@pytest.mark.parametrize("name", PIPELINE_MODELS)
@pytest.mark.parametrize("release", RELEASES)
def test_rendered_io_equals_the_release_io(
    engine: dict[str, object], name: str, release: str
) -> None:
    model = parse_spec(one_model_spec(engine, release=release)).models[0]
    rendered = parse_config(render_config(model, name))
    assert io_signature(rendered) == expected_io(release, name)
    assert rendered.max_batch_size == 64


@pytest.mark.parametrize("release", RELEASES)
def test_rendered_ensemble_maps_what_the_stock_ensemble_maps(release: str) -> None:
    model = parse_spec(one_model_spec(TORCH, release=release)).models[0]
    rendered = parse_config(render_config(model, "ensemble")).ensemble_scheduling.step
    stock = stock_config(release, "ensemble").ensemble_scheduling.step
    assert [s.model_name for s in rendered] == [f"m1_{s.model_name}" for s in stock]
    for ours, theirs in zip(rendered, stock, strict=True):
        extra_in = set(ours.input_map.items()) - set(theirs.input_map.items())
        extra_out = set(ours.output_map.items()) - set(theirs.output_map.items())
        assert set(theirs.input_map.items()) <= set(ours.input_map.items())
        assert set(theirs.output_map.items()) <= set(ours.output_map.items())
        if release == "latest" and ours.model_name == "m1_tensorrt_llm":
            assert {k for k, _ in extra_in} == {
                *(f"return_num_{k}_tokens" for k in ("input", "output")),
                "cache_salt_id",
            }
            assert {k for k, _ in extra_out} == {f"num_{k}_tokens" for k in ("input", "output")}
        else:
            assert extra_in == extra_out == set()


def test_latest_templates_carry_the_newest_input_names() -> None:
    model = parse_spec(one_model_spec(TORCH, release="latest")).models[0]
    engine = {t.name for t in parse_config(render_config(model, "tensorrt_llm")).input}
    assert {"min_tokens", "seed"} <= engine
    assert not {"min_length", "random_seed"} & engine
    old = parse_spec(one_model_spec(TORCH, release="v0.19")).models[0]
    engine = {t.name for t in parse_config(render_config(old, "tensorrt_llm")).input}
    assert {"min_length", "random_seed"} <= engine


def test_packaged_templates_of_numbered_releases_are_the_stock_files() -> None:
    for release in ("v0.8", "v0.11", "v0.19"):
        for name in PIPELINE_MODELS:
            packaged = (PACKAGED / release / name / "config.pbtxt").read_text()
            assert packaged == reference_template(release, name).read_text()


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("engine", [TORCH, TRTLLM], ids=["torch", "tensorrtllm"])
def test_names_are_prefixed_and_wired(engine: dict[str, object], release: str) -> None:
    model = parse_spec(one_model_spec(engine, release=release)).models[0]
    configs = {name: parse_config(render_config(model, name)) for name in PIPELINE_MODELS}
    assert {c.name for c in configs.values()} == {f"m1_{n}" for n in PIPELINE_MODELS}
    steps = [s.model_name for s in configs["ensemble"].ensemble_scheduling.step]
    assert steps == ["m1_preprocessing", "m1_tensorrt_llm", "m1_postprocessing"]
    bls = configs["tensorrt_llm_bls"].parameters
    assert bls["tensorrt_llm_model_name"].string_value == "m1_tensorrt_llm"
    assert bls["preprocessing_model_name"].string_value == "m1_preprocessing"
    assert bls["postprocessing_model_name"].string_value == "m1_postprocessing"
    assert bls["forwards_cancellation"].string_value == "true"
    assert bls["forwards_declared_inputs"].string_value == "true"
    assert configs["preprocessing"].parameters["tokenizer_dir"].string_value == "tok/id"


@pytest.mark.parametrize("release", RELEASES)
def test_torch_engine_config(release: str) -> None:
    spec = one_model_spec(
        {
            **TORCH,
            "device": "cuda:1",
            "dtype": "bfloat16",
            "max_batch_size": 8,
            "max_beam_width": 4,
        },
        release=release,
    )
    config = parse_config(render_config(parse_spec(spec).models[0], "tensorrt_llm"))
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert config.backend == "python"
    assert config.model_transaction_policy.decoupled is True
    assert params["gpt_model_path"] == "some/hub-id"
    assert params["torch_device"] == "cuda:1"
    assert params["torch_dtype"] == "bfloat16"
    assert params["torch_max_batch_size"] == "8"
    assert params["max_beam_width"] == "4"
    assert not any("${" in v for v in params.values())


KV_SETTINGS = {
    "enable_kv_cache_reuse": False,
    "enable_chunked_context": True,
    "kv_cache_free_gpu_mem_fraction": 0.5,
    "max_tokens_in_paged_kv_cache": 4096,
    "tokens_per_block": 16,
    "max_num_tokens": 256,
}


@pytest.mark.parametrize("release", RELEASES)
def test_torch_kv_cache_settings_reach_the_engine(release: str) -> None:
    from google.protobuf import json_format

    from deploy.triton.engine.config import settings_from_model_config
    from deploy.triton.engine.types import EngineConfig, KvCacheConfig

    def engine(**settings: object) -> EngineConfig:
        spec = one_model_spec({**TORCH, **settings}, release=release)
        config = parse_config(render_config(parse_spec(spec).models[0], "tensorrt_llm"))
        document = json_format.MessageToDict(config, preserving_proto_field_name=True)
        read = settings_from_model_config(document).engine
        assert isinstance(read, EngineConfig)
        return read

    chosen = engine(**KV_SETTINGS)
    assert chosen.kv_cache == KvCacheConfig(16, False, 0.5, 4096)
    assert (chosen.enable_chunked_context, chosen.max_num_tokens) == (True, 256)
    default = engine()
    assert default.kv_cache == KvCacheConfig()  # reuse on, as the C++ backend's default
    assert (default.enable_chunked_context, default.max_num_tokens) == (False, 8192)


def test_a_cpp_engines_block_size_is_read_from_its_build(tmp_path: Path) -> None:
    import json

    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    build = {"build_config": {"plugin_config": {"tokens_per_block": 64}}}
    (engine_dir / "config.json").write_text(json.dumps(build))
    spec = one_model_spec({**TRTLLM, "engine_dir": str(engine_dir)})
    config = parse_config(render_config(parse_spec(spec).models[0], "tensorrt_llm"))
    assert config.parameters["tokens_per_block"].string_value == "64"
    elsewhere = parse_config(
        render_config(parse_spec(one_model_spec(TRTLLM)).models[0], "tensorrt_llm")
    )
    assert "tokens_per_block" not in elsewhere.parameters


def test_tensorrtllm_engine_config_keeps_only_set_parameters() -> None:
    spec = one_model_spec(
        {**TRTLLM, "kv_cache_free_gpu_mem_fraction": 0.5, "parameters": {"decoding_mode": "top_p"}}
    )
    config = parse_config(render_config(parse_spec(spec).models[0], "tensorrt_llm"))
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
    files = render_model(parse_spec(one_model_spec(TORCH)).models[0])
    for name in ("preprocessing", "postprocessing", "tensorrt_llm_bls", "tensorrt_llm"):
        assert "TritonPythonModel" in files[f"m1_{name}/1/model.py"]
    assert "m1_ensemble/1/.keep" in files
    trt = render_model(parse_spec(one_model_spec(TRTLLM)).models[0])
    assert "m1_tensorrt_llm/1/model.py" not in trt
    assert "m1_tensorrt_llm/1/.keep" in trt


def test_values_are_escaped_for_pbtxt() -> None:
    spec = one_model_spec({**TORCH, "model_dir": 'C:\\models\\"odd"'})
    config = parse_config(render_config(parse_spec(spec).models[0], "tensorrt_llm"))
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


@pytest.mark.parametrize(
    ("release", "required"),
    [
        ("v0.8", "TOKENS_BATCH,SEQUENCE_LENGTH,CUM_LOG_PROBS,OUTPUT_LOG_PROBS"),
        ("v0.11", "TOKENS_BATCH,SEQUENCE_LENGTH"),
        ("latest", "TOKENS_BATCH,SEQUENCE_LENGTH"),
    ],
)
def test_bls_learns_what_the_releases_postprocessing_requires(release: str, required: str) -> None:
    model = parse_spec(one_model_spec(TORCH, release=release)).models[0]
    bls = parse_config(render_config(model, "tensorrt_llm_bls")).parameters
    assert bls["postprocessing_required_inputs"].string_value == required
    stock = {t.name for t in stock_config(release, "postprocessing").input if not t.optional}
    assert set(required.split(",")) == stock
