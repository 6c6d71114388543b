"""LoRA adapter folders in TensorRT-LLM's layout: read as written, or converted from PEFT.

TensorRT-LLM wants ``lora_weights`` ``[1, rows, width]`` (each row the flattened ``A`` ``[r, in]``
then the flattened ``B`` ``[out, r]`` scaled by alpha/r, or alpha/sqrt(r) with rsLoRA, zero
padded) and ``lora_config`` ``[1, rows, 3|4]`` (``[module_id, layer_idx, r(, is_dora)]``), as
its ``hf_lora_convert.py`` writes them. A PEFT folder (``adapter_config.json`` and
``adapter_model.safetensors``) is converted the same way, rows ordered by layer then module id.
Everything here blocks (file reads): call it from a worker thread.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]

MODULE_IDS = {
    "qkv_proj": 0,
    "query_key_value": 0,
    "q_proj": 1,
    "k_proj": 2,
    "v_proj": 3,
    "o_proj": 4,
    "dense": 4,
    "gate_proj": 5,
    "gate_up_proj": 5,
    "c_fc": 5,
    "down_proj": 6,
    "c_proj": 6,
    "up_proj": 7,
}
"""Hugging Face module names and TensorRT-LLM's LoRA module ids, as ``hf_lora_convert.py``."""
_KEY = re.compile(r".*\.layers\.(\d+)\.(self_attn|mlp)\.([a-z_]+)\.lora_([AB])\.weight$")
_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": None}


class AdapterError(ValueError):
    """An adapter folder that cannot be served; the message names the file and the problem."""


@dataclass(frozen=True)
class TrtLora:
    """An adapter in TensorRT-LLM's layout: weights ``[rows, width]``, config ``[rows, 3|4]``."""

    weights: Array
    config: Array


@dataclass(frozen=True)
class BaseShapes:
    """The base model's layer count and each module's (in, out) features, from ``config.json``."""

    layers: int
    modules: dict[int, tuple[int, int]]

    @classmethod
    def read(cls, folder: str | Path) -> BaseShapes | None:
        """The shapes of a Llama-style model folder; None when it has no usable ``config.json``."""
        path = Path(folder) / "config.json"
        try:
            config = json.loads(path.read_text())
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            kv_heads = int(config.get("num_key_value_heads") or heads)
            head_dim = int(config.get("head_dim") or hidden // heads)
            inner = int(config["intermediate_size"])
            layers = int(config["num_hidden_layers"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        q, kv = heads * head_dim, kv_heads * head_dim
        modules = {
            0: (hidden, q + 2 * kv),
            1: (hidden, q),
            2: (hidden, kv),
            3: (hidden, kv),
            4: (q, hidden),
            5: (hidden, inner),
            6: (inner, hidden),
            7: (hidden, inner),
        }
        return cls(layers, modules)


def load_adapter(folder: str | Path, base: BaseShapes | None) -> TrtLora:
    """Read a TensorRT-LLM or PEFT adapter folder and check it against the base model."""
    path = Path(folder)
    if not path.is_dir():
        raise AdapterError(f"{path}: no such adapter folder")
    if (path / "model.lora_weights.npy").exists():
        lora = _read_trtllm(path)
    elif (path / "adapter_config.json").exists():
        lora = _convert_peft(path, base)
    else:
        raise AdapterError(
            f"{path}: neither model.lora_weights.npy (TensorRT-LLM) nor adapter_config.json (PEFT)"
        )
    if base is not None:
        _check(lora, base, path)
    return lora


def _read_trtllm(path: Path) -> TrtLora:
    weights = _npy(path / "model.lora_weights.npy")
    config_path = path / "model.lora_config.npy"
    if not config_path.exists():
        config_path = path / "model.lora_keys.npy"
    config = _npy(config_path)
    weights, config = (
        _unbatched(weights, path / "model.lora_weights.npy"),
        _unbatched(config, config_path),
    )
    if not np.issubdtype(weights.dtype, np.floating):
        raise AdapterError(f"{path}/model.lora_weights.npy: dtype {weights.dtype} is not a float")
    if not np.issubdtype(config.dtype, np.integer) or config.shape[1] not in (3, 4):
        raise AdapterError(f"{config_path}: expected integer rows of 3 or 4, got {config.shape}")
    if weights.shape[0] != config.shape[0]:
        raise AdapterError(
            f"{path}: {weights.shape[0]} weight rows but {config.shape[0]} config rows"
        )
    return TrtLora(weights.astype(np.float32), config.astype(np.int32))


def _npy(path: Path) -> Array:
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path}: cannot read ({exc})") from None
    return np.asarray(array)


def _unbatched(array: Array, path: Path) -> Array:
    if array.ndim == 3 and array.shape[0] == 1:
        return np.asarray(array[0])
    if array.ndim == 2:
        return array
    raise AdapterError(f"{path}: expected shape [1, rows, cols], got {list(array.shape)}")


def _convert_peft(path: Path, base: BaseShapes | None) -> TrtLora:
    config_file = path / "adapter_config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{config_file}: cannot read ({exc})") from None
    if config.get("use_dora"):
        raise AdapterError(f"{config_file}: DoRA adapters are not supported")
    pairs = _pairs(path, read_safetensors(path / "adapter_model.safetensors"))
    rows, entries = [], []
    for (layer, module_id), sides in sorted(pairs.items()):
        if set(sides) != {"A", "B"}:
            raise AdapterError(f"{path}: layer {layer} module {module_id} lacks lora_A or lora_B")
        a, b = sides["A"], sides["B"]
        rank = a.shape[0]
        if b.shape[1] != rank:
            raise AdapterError(
                f"{path}: layer {layer} module {module_id}: lora_A has rank {rank}, "
                f"lora_B {b.shape[1]}"
            )
        if base is not None and module_id in base.modules:
            fan_in, fan_out = base.modules[module_id]
            if a.shape[1] != fan_in or b.shape[0] != fan_out:
                raise AdapterError(
                    f"{path}: layer {layer} module {module_id} adapts a {a.shape[1]}x{b.shape[0]} "
                    f"projection; the base model's is {fan_in}x{fan_out}"
                )
        scale = _scale(config, rank, module_id)
        rows.append(np.concatenate([a.reshape(-1), (b * scale).reshape(-1)]))
        entries.append([module_id, layer, rank])
    if not rows:
        raise AdapterError(f"{path}/adapter_model.safetensors: no LoRA weights")
    width = max(row.size for row in rows)
    weights = np.zeros((len(rows), width), np.float32)
    for index, row in enumerate(rows):
        weights[index, : row.size] = row
    return TrtLora(weights, np.asarray(entries, np.int32))


def _pairs(path: Path, tensors: dict[str, Array]) -> dict[tuple[int, int], dict[str, Array]]:
    """``lora_A``/``lora_B`` matrices by (layer, module id)."""
    pairs: dict[tuple[int, int], dict[str, Array]] = {}
    for key, value in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(f"{path}/adapter_model.safetensors: unexpected tensor {key}")
        layer, module, side = int(match.group(1)), match.group(3), match.group(4)
        if module not in MODULE_IDS:
            raise AdapterError(f"{path}: module {module} has no TensorRT-LLM LoRA module")
        if value.ndim != 2:
            raise AdapterError(f"{path}: {key} is not a matrix: {list(value.shape)}")
        if module == "gate_up_proj" and side == "B":
            half = value.shape[0] // 2
            value = np.concatenate([value[half:], value[:half]])
        pairs.setdefault((layer, MODULE_IDS[module]), {})[side] = value
    return pairs


def _scale(config: dict[str, Any], rank: int, module_id: int) -> float:
    alpha = float(config.get("lora_alpha", config.get("r", rank)))
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        names = [name for name, ident in MODULE_IDS.items() if ident == module_id]
        if any(pattern.endswith(name) for name in names):
            alpha = float(value)
    return alpha / (rank**0.5) if config.get("use_rslora") else alpha / rank


def read_safetensors(path: Path) -> dict[str, Array]:
    """Every tensor of a ``.safetensors`` file as float32 (bfloat16 widened exactly)."""
    try:
        data = path.read_bytes()
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
    except (OSError, ValueError, struct.error) as exc:
        raise AdapterError(f"{path}: not a readable safetensors file ({exc})") from None
    body = memoryview(data)[8 + length :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info.get("dtype")
        if dtype not in _SAFETENSORS_DTYPES:
            raise AdapterError(f"{path}: tensor {name} has dtype {dtype}, not a float type")
        start, end = info["data_offsets"]
        raw = body[start:end]
        if dtype == "BF16":
            bits = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
            array = bits.view(np.float32)
        else:
            array = np.frombuffer(raw, _SAFETENSORS_DTYPES[dtype]).astype(np.float32)
        tensors[name] = array.reshape(info["shape"])
    return tensors


def _check(lora: TrtLora, base: BaseShapes, path: Path) -> None:
    for row, (module_id, layer, rank, *rest) in enumerate(lora.config.tolist()):
        if rest and rest[0]:
            raise AdapterError(f"{path}: row {row} is a DoRA module, which is not supported")
        if module_id not in base.modules:
            raise AdapterError(f"{path}: row {row}: the base model has no LoRA module {module_id}")
        if not 0 <= layer < base.layers:
            raise AdapterError(
                f"{path}: row {row}: layer {layer}, but the base model has {base.layers} layers"
            )
        fan_in, fan_out = base.modules[module_id]
        if rank <= 0 or rank * (fan_in + fan_out) > lora.weights.shape[1]:
            raise AdapterError(
                f"{path}: row {row} (module {module_id}, layer {layer}): rank {rank} needs "
                f"{rank * (fan_in + fan_out)} values for the base model's {fan_in}x{fan_out} "
                f"projection; the row holds {lora.weights.shape[1]}"
            )
