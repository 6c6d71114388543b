"""PEFT and TensorRT-LLM adapter folders into TensorRT-LLM's tensors, checked independently."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from gateway.catalog.lora.convert import AdapterError, BaseShapes, load_adapter
from gateway.catalog.lora.library import task_id
from tests.support.lora import AdapterRecipe, make_peft_adapter

# TensorRT-LLM's module ids (tensorrt_llm/lora_manager.py), written out for the test.
TRTLLM_IDS = {
    "q_proj": 1,
    "k_proj": 2,
    "v_proj": 3,
    "o_proj": 4,
    "gate_proj": 5,
    "down_proj": 6,
    "up_proj": 7,
}


@pytest.fixture(scope="module")
def base(tiny_model_dir: Path) -> BaseShapes:
    shapes = BaseShapes.read(tiny_model_dir)
    assert shapes is not None
    return shapes


def _expected(folder: Path) -> dict[tuple[int, int], np.ndarray]:
    """Each (module id, layer) row as hf_lora_convert.py defines it: A flat, then scaled B flat."""
    config = json.loads((folder / "adapter_config.json").read_text())
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    rows = {}
    for name, a in tensors.items():
        if ".lora_A." not in name:
            continue
        b = tensors[name.replace(".lora_A.", ".lora_B.")]
        parts = name.split(".")
        layer = int(parts[parts.index("layers") + 1])
        module = parts[parts.index("lora_A") - 1]
        rank = a.shape[0]
        scale = config["lora_alpha"] / (rank**0.5 if config.get("use_rslora") else rank)
        row = torch.cat([a.float().reshape(-1), (b.float() * scale).reshape(-1)]).numpy()
        rows[(TRTLLM_IDS[module], layer)] = row
    return rows


@pytest.mark.parametrize("rslora", [False, True])
def test_peft_folders_convert_to_tensorrt_llms_layout(
    tiny_model_dir: Path, tmp_path: Path, base: BaseShapes, rslora: bool
) -> None:
    recipe = AdapterRecipe(rank=4, alpha=16, targets=("q_proj", "o_proj", "up_proj"), seed=5,
                           rslora=rslora)  # fmt: skip
    folder = make_peft_adapter(tiny_model_dir, tmp_path / "adapter", recipe)
    lora = load_adapter(folder, base)
    expected = _expected(folder)

    assert lora.config.dtype == np.int32 and lora.config.shape == (len(expected), 3)
    keys = [(int(m), int(layer)) for m, layer, _ in lora.config.tolist()]
    assert keys == sorted(expected, key=lambda k: (k[1], k[0]))  # by layer, then module id
    assert all(rank == 4 for *_, rank in lora.config.tolist())
    width = max(row.size for row in expected.values())
    assert lora.weights.shape == (len(expected), width)
    for index, key in enumerate(keys):
        row = expected[key]
        np.testing.assert_allclose(lora.weights[index, : row.size], row, rtol=1e-6)
        assert not lora.weights[index, row.size :].any()


def test_bfloat16_safetensors_are_read_exactly(
    tiny_model_dir: Path, tmp_path: Path, base: BaseShapes
) -> None:
    recipe = AdapterRecipe(rank=2, alpha=2, targets=("v_proj",), seed=6)
    folder = make_peft_adapter(tiny_model_dir, tmp_path / "adapter", recipe)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    save_file({k: v.bfloat16() for k, v in tensors.items()}, folder / "adapter_model.safetensors")
    lora = load_adapter(folder, base)
    expected = _expected(folder)
    for index, (module, layer, _) in enumerate(lora.config.tolist()):
        row = expected[(module, layer)]
        np.testing.assert_array_equal(lora.weights[index, : row.size], row)


def test_tensorrt_llm_folders_are_read_as_written(tmp_path: Path, base: BaseShapes) -> None:
    weights = np.random.default_rng(0).standard_normal((1, 2, 4 * 128)).astype(np.float16)
    config = np.array([[[1, 0, 4, 0], [3, 1, 4, 0]]], np.int32)
    np.save(tmp_path / "model.lora_weights.npy", weights)
    np.save(tmp_path / "model.lora_config.npy", config)
    lora = load_adapter(tmp_path, base)
    np.testing.assert_array_equal(lora.weights, weights[0].astype(np.float32))
    np.testing.assert_array_equal(lora.config, config[0])


def test_task_ids_follow_the_content_not_the_name(tmp_path: Path, base: BaseShapes) -> None:
    np.save(tmp_path / "model.lora_weights.npy", np.ones((1, 1, 512), np.float16))
    np.save(tmp_path / "model.lora_config.npy", np.array([[[1, 0, 4]]], np.int32))
    first, again = load_adapter(tmp_path, base), load_adapter(tmp_path, base)
    assert task_id(first) == task_id(again)
    assert 0 <= task_id(first) < 2**63
    np.save(tmp_path / "model.lora_weights.npy", np.full((1, 1, 512), 2, np.float16))
    assert task_id(load_adapter(tmp_path, base)) != task_id(first)


def _peft(folder: Path, tensors: dict[str, torch.Tensor], **config: object) -> Path:
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 4, **config}))
    save_file(tensors, folder / "adapter_model.safetensors")
    return folder


def _key(layer: int, module: str, side: str) -> str:
    group = "mlp" if module.endswith(("gate_proj", "up_proj", "down_proj")) else "self_attn"
    return f"base_model.model.model.layers.{layer}.{group}.{module}.lora_{side}.weight"


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({_key(5, "q_proj", "A"): torch.ones(4, 64), _key(5, "q_proj", "B"): torch.ones(64, 4)},
         "layer 5, but the base model has 2 layers"),
        ({_key(0, "q_proj", "A"): torch.ones(4, 96), _key(0, "q_proj", "B"): torch.ones(64, 4)},
         "adapts a 96x64 projection; the base model's is 64x64"),
        ({_key(0, "q_proj", "A"): torch.ones(4, 64)}, "lacks lora_A or lora_B"),
        ({_key(0, "rotary", "A"): torch.ones(4, 64), _key(0, "rotary", "B"): torch.ones(64, 4)},
         "module rotary has no TensorRT-LLM LoRA module"),
        ({_key(0, "q_proj", "A"): torch.ones(4, 64), _key(0, "q_proj", "B"): torch.ones(64, 2)},
         "lora_A has rank 4, lora_B 2"),
    ],
)  # fmt: skip
def test_bad_peft_adapters_are_refused_naming_the_problem(
    tmp_path: Path, base: BaseShapes, tensors: dict[str, torch.Tensor], message: str
) -> None:
    folder = _peft(tmp_path / "bad", tensors)
    with pytest.raises(AdapterError, match=message) as caught:
        load_adapter(folder, base)
    assert str(folder) in str(caught.value)


def test_bad_folders_are_refused(tmp_path: Path, base: BaseShapes) -> None:
    with pytest.raises(AdapterError, match="no such adapter folder"):
        load_adapter(tmp_path / "missing", base)
    with pytest.raises(AdapterError, match=re.escape("neither model.lora_weights.npy")):
        load_adapter(tmp_path, base)
    np.save(tmp_path / "model.lora_weights.npy", np.ones((1, 1, 512), np.int32))
    np.save(tmp_path / "model.lora_config.npy", np.array([[[1, 0, 4]]], np.int32))
    with pytest.raises(AdapterError, match="is not a float"):
        load_adapter(tmp_path, base)
    np.save(tmp_path / "model.lora_weights.npy", np.ones((1, 1, 100), np.float16))
    with pytest.raises(AdapterError, match="rank 4 needs 512 values"):
        load_adapter(tmp_path, base)
    dora = _peft(tmp_path / "dora", {}, use_dora=True)
    with pytest.raises(AdapterError, match="DoRA"):
        load_adapter(dora, base)
