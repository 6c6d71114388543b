"""The parts of a repository that a pipeline with a vision model adds: the
``multimodal_encoders`` model, image inputs on the ensemble and the BLS, and the ensemble's
encoder step between preprocessing and the engine (the stock ``all_models/multimodal`` way)."""

from __future__ import annotations

import re

from deploy.sidecar.spec import ModelSpec, TorchEngine

ENCODER = "multimodal_encoders"
ENCODER_RELEASE = "v0.19"
_IMAGE_INPUTS = (
    ("image_input", "TYPE_FP16", "[ -1, -1, -1, -1 ]"),
    ("image_bytes_input", "TYPE_UINT8", "[ -1, -1, -1, -1 ]"),
    ("image_url_input", "TYPE_STRING", "[ -1 ]"),
)
_TABLE_INPUT = re.compile(
    r'\s*\{\s*name:\s*"(prompt_embedding_table|prompt_vocab_size)"(?:[^{}]|\{[^{}]*\})*\},'
)
_STEP_PREFIX = '    {\n      model_name: "'


def encoder_values(model: ModelSpec) -> dict[str, str]:
    """Placeholder values of the ``multimodal_encoders`` config."""
    assert model.vision_model is not None
    return {
        "triton_max_batch_size": str(model.triton_max_batch_size),
        "max_queue_delay_microseconds": "0",
        "max_queue_size": "0",
        "encoder_input_features_data_type": "TYPE_FP16",
        "multimodal_model_path": model.vision_model,
        "hf_model_path": model.vision_model,
    }


def encoder_parameters(model: ModelSpec) -> dict[str, str]:
    """Parameters of our encoder beyond the stock ones: the engine's torch device and dtype."""
    if isinstance(model.engine, TorchEngine):
        return {"torch_device": model.engine.device, "torch_dtype": model.engine.dtype}
    return {}


def _input_entry(name: str, dtype: str, dims: str) -> str:
    return (
        f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: {dims}\n'
        "    optional: true\n  },"
    )


def _map(kind: str, key: str, value: str) -> str:
    return f'      {kind} {{\n        key: "{key}"\n        value: "{value}"\n      }}\n'


def vision_ensemble(text: str, model: ModelSpec) -> str:
    """The ensemble config with image inputs and an encoder step whose table feeds the engine."""
    head, sep, rest = text.partition("\ninput [")
    rest = _TABLE_INPUT.sub("", rest, count=2)
    entries = "\n".join(_input_entry(*spec) for spec in _IMAGE_INPUTS)
    text = f"{head}{sep}\n{entries}{rest}"
    preprocessing = _STEP_PREFIX + model.triton_name("preprocessing") + '"'
    engine = _STEP_PREFIX + model.triton_name("tensorrt_llm") + '"'
    if preprocessing not in text or engine not in text:
        raise ValueError("the ensemble template has no preprocessing and engine steps")
    pre_maps = (
        _map("input_map", "IMAGE_BYTES", "image_bytes_input")
        + _map("input_map", "IMAGE_URL", "image_url_input")
        + _map("output_map", "PIXEL_VALUES", "_PIXEL_VALUES")
    )
    text = text.replace(
        preprocessing + "\n      model_version: -1\n",
        preprocessing + "\n      model_version: -1\n" + pre_maps,
        1,
    )
    step = (
        _STEP_PREFIX
        + model.triton_name(ENCODER)
        + '"\n      model_version: -1\n'
        + _map("input_map", "IMAGE", "image_input")
        + _map("input_map", "pixel_values", "_PIXEL_VALUES")
        + _map("output_map", "OUT_PROMPT_EMBEDDING_TABLE", "_PROMPT_EMBEDDING_TABLE")
        + _map("output_map", "OUT_PROMPT_VOCAB_SIZE", "_PROMPT_VOCAB_SIZE")
        + "    },\n"
    )
    text = text.replace(engine, step + engine, 1)
    for name, tensor in (
        ("prompt_embedding_table", "_PROMPT_EMBEDDING_TABLE"),
        ("prompt_vocab_size", "_PROMPT_VOCAB_SIZE"),
    ):
        pattern = r'(key:\s*"' + name + r'"\s*value:\s*)"' + name + '"'
        text = re.sub(pattern, r'\1"' + tensor + '"', text, count=1)
    return text


def image_url_dims(text: str, name: str) -> str:
    """A config whose ``name`` input takes several image URLs (``[-1]``, one per image)."""
    return re.sub(
        r'(name:\s*"' + name + r'"\s*data_type:\s*TYPE_STRING\s*dims:\s*)\[\s*1\s*\]',
        r"\1[ -1 ]",
        text,
        count=1,
    )
