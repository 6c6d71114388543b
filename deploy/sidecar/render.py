"""Render Triton model repositories of the five TensorRT-LLM models from the stock configs."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from deploy.sidecar import render_vision as vision
from deploy.sidecar.models import resolve_model
from deploy.sidecar.spec import (
    PIPELINE_MODELS,
    LoadTestEngine,
    ModelSpec,
    SidecarSpec,
    Spec,
    SpecError,
    TensorRTLLMEngine,
    TorchEngine,
    looks_like_path,
    sidecar_model,
)

TEMPLATES = Path(__file__).parent / "templates"
BACKENDS = Path(__file__).resolve().parents[1] / "triton" / "backends"
PYTHON_MODELS = ("preprocessing", "postprocessing", "tensorrt_llm_bls")

PLACEHOLDER = re.compile(r"\$\{(\w+)\}")
PARAMETER_BLOCK = re.compile(
    r'parameters:?\s*\{\s*key:\s*"(?P<key>\w+)"\s*value:\s*\{\s*'
    r'string_value:\s*"\$\{(?P<placeholder>\w+)\}"\s*\}\s*\}\s*',
)
COMMENTED_PLACEHOLDER = re.compile(r"^\s*#.*\$\{\w+\}.*\n", re.M)
INPUT_ENTRY = re.compile(r'\{\s*name:\s*"(\w+)"((?:[^{}]|\{[^{}]*\})*)\}')
# Defaults that the stock fill_template.py merges into every call.
FILL_DEFAULTS = {"max_queue_size": "0", "max_queue_delay_microseconds": "0"}


class RenderError(SpecError):
    """A repository that cannot be rendered; the message names the model and the cause."""


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _optional(values: Mapping[str, object | None]) -> dict[str, str]:
    out = {}
    for key, value in values.items():
        if value is None:
            continue
        out[key] = _flag(value) if isinstance(value, bool) else str(value)
    return out


def template_values(model: ModelSpec, name: str) -> dict[str, str]:
    """The placeholder values of one pipeline model's config."""
    common = {
        **FILL_DEFAULTS,
        "triton_max_batch_size": str(model.triton_max_batch_size),
        "logits_datatype": "TYPE_FP32",
        "prompt_embedding_table_data_type": "TYPE_FP16",
    }
    if name in ("preprocessing", "postprocessing"):
        tokenizer = {"tokenizer_dir": model.tokenizer, "tokenizer_type": "auto"}
        if name == "preprocessing":
            return (
                common
                | tokenizer
                | {
                    "add_special_tokens": _flag(model.add_special_tokens),
                    "preprocessing_instance_count": str(model.preprocessing_instances),
                }
                | _optional({"multimodal_model_path": model.vision_model})
            )
        return (
            common
            | tokenizer
            | {
                "skip_special_tokens": _flag(model.skip_special_tokens),
                # Streaming detokenization state lives in the one instance that sees every chunk.
                "postprocessing_instance_count": "1",
            }
        )
    if name == "tensorrt_llm_bls":
        encoder = vision.ENCODER if model.vision_model is not None else None
        return (
            common
            | {
                "decoupled_mode": _flag(model.decoupled),
                "bls_instance_count": str(model.bls_instances),
                "accumulate_tokens": _flag(model.accumulate_tokens),
            }
            | _optional({"multimodal_encoders_name": encoder and model.triton_name(encoder)})
        )
    if name == vision.ENCODER:
        return vision.encoder_values(model)
    if name == "tensorrt_llm":
        return common | _engine_values(model)
    return common


def _engine_values(model: ModelSpec) -> dict[str, str]:
    engine = model.engine
    values = {
        "decoupled_mode": _flag(model.decoupled),
        "encoder_input_features_data_type": "TYPE_FP16",
        "exclude_input_in_output": _flag(model.exclude_input_in_output),
    }
    if isinstance(engine, TorchEngine):
        return (
            values
            | {
                "triton_backend": "python",
                "engine_dir": engine.model_dir,
                "max_beam_width": str(engine.max_beam_width),
            }
            | _optional(
                {
                    "kv_cache_free_gpu_mem_fraction": engine.kv_cache_free_gpu_mem_fraction,
                    "max_tokens_in_paged_kv_cache": engine.max_tokens_in_paged_kv_cache,
                    "enable_kv_cache_reuse": engine.enable_kv_cache_reuse,
                    "enable_chunked_context": engine.enable_chunked_context,
                }
            )
        )
    if isinstance(engine, LoadTestEngine):
        # It keeps no KV cache: saying so lets the gateway serve it to tenants of every cache
        # scope from configs without ``cache_salt_id``.
        return values | {
            "triton_backend": "python",
            "max_beam_width": "1",
            "enable_kv_cache_reuse": "false",
        }
    return (
        values
        | {
            "triton_backend": "tensorrtllm",
            "engine_dir": engine.engine_dir,
            "batching_strategy": engine.batching_strategy,
            "batch_scheduler_policy": engine.batch_scheduler_policy,
            "max_beam_width": str(engine.max_beam_width),
        }
        | _optional(
            {
                "gpu_device_ids": engine.gpu_device_ids,
                "participant_ids": engine.participant_ids,
                "kv_cache_free_gpu_mem_fraction": engine.kv_cache_free_gpu_mem_fraction,
                "max_tokens_in_paged_kv_cache": engine.max_tokens_in_paged_kv_cache,
                "enable_kv_cache_reuse": engine.enable_kv_cache_reuse,
                "enable_chunked_context": engine.enable_chunked_context,
                "lora_cache_optimal_adapter_size": engine.lora_cache_optimal_adapter_size,
                "lora_cache_max_adapter_size": engine.lora_cache_max_adapter_size,
                "lora_cache_gpu_memory_fraction": engine.lora_cache_gpu_memory_fraction,
                "lora_cache_host_memory_bytes": engine.lora_cache_host_memory_bytes,
                "lora_prefetch_dir": engine.lora_prefetch_dir,
            }
        )
        | dict(engine.parameters)
    )


def required_inputs(config: str) -> list[str]:
    """Names of the inputs a ``config.pbtxt`` text declares without ``optional: true``."""
    inputs = config.split("\noutput [", 1)[0].split("\ninput [", 1)[-1]
    return [
        match.group(1)
        for match in INPUT_ENTRY.finditer(inputs)
        if not re.search(r"optional:\s*true", match.group(2))
    ]


def _extra_parameters(model: ModelSpec, name: str) -> dict[str, str]:
    """Parameters our Python models read beyond the ones the release's template declares."""
    in_text_env = name in PYTHON_MODELS or (
        name == "tensorrt_llm" and isinstance(model.engine, LoadTestEngine)
    )
    if in_text_env and model.text_python_env is not None:
        return {"EXECUTION_ENV_PATH": model.text_python_env} | _model_parameters(model, name)
    return _model_parameters(model, name)


def _model_parameters(model: ModelSpec, name: str) -> dict[str, str]:
    if name == "tensorrt_llm_bls":
        postprocessing = template(model.release, "postprocessing").read_text()
        return {
            "tensorrt_llm_model_name": model.triton_name("tensorrt_llm"),
            "preprocessing_model_name": model.triton_name("preprocessing"),
            "postprocessing_model_name": model.triton_name("postprocessing"),
            "postprocessing_required_inputs": ",".join(required_inputs(postprocessing)),
            # Tell the gateway that this BLS forwards client cancellation to the engine, and
            # every input it declares (the stock one before v0.13 drops `temperature`).
            "forwards_cancellation": "true",
            "forwards_declared_inputs": "true",
        }
    if name == "tensorrt_llm" and isinstance(model.engine, TorchEngine):
        engine = model.engine
        guided = {"guided_decoding_backend": "xgrammar"} if engine.guided_decoding else {}
        return (
            guided
            | {
                "torch_device": engine.device,
                "torch_dtype": engine.dtype,
                "torch_max_batch_size": str(engine.max_batch_size),
                "torch_max_seq_len": str(engine.max_seq_len),
                "torch_lora_cache_size": str(engine.lora_cache_size),
                "torch_mixed_batching": "true" if engine.mixed_batching else "false",
            }
            | _optional(
                {
                    "tokens_per_block": engine.tokens_per_block,
                    "max_num_tokens": engine.max_num_tokens,
                    "guided_decoding_compile_timeout_ms": engine.guided_decoding_compile_timeout_ms,
                    "guided_decoding_max_compiles": engine.guided_decoding_max_compiles,
                    "guided_decoding_cache_mb": engine.guided_decoding_cache_mb,
                    "kv_transfer_timeout_ms": engine.kv_transfer_timeout_ms,
                }
            )
        )
    if name == vision.ENCODER:
        return vision.encoder_parameters(model)
    if name == "tensorrt_llm" and isinstance(model.engine, TensorRTLLMEngine):
        # The gateway reads the block size to turn reused blocks into cached prompt tokens.
        return _optional({"tokens_per_block": engine_tokens_per_block(model.engine.engine_dir)})
    if name == "tensorrt_llm" and isinstance(model.engine, LoadTestEngine):
        paced = model.engine
        return {
            "load_test_model": "true",
            "loadtest_token_s": repr(paced.token_s),
            "loadtest_prompt_token_s": repr(paced.prompt_token_s),
            "loadtest_max_batch_size": str(paced.max_batch_size),
            "loadtest_senders": str(paced.senders),
        } | _optional({"loadtest_token_id": paced.token_id})
    return {}


def engine_tokens_per_block(engine_dir: str) -> int | None:
    """The KV-cache block size a TensorRT-LLM engine was built with (its ``config.json``), when
    the engine folder is here to read."""
    try:
        config = json.loads((Path(engine_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for plugins in (
        config.get("build_config", {}).get("plugin_config"),
        config.get("plugin_config"),
    ):
        if isinstance(plugins, dict) and isinstance(plugins.get("tokens_per_block"), int):
            return int(plugins["tokens_per_block"])
    return None


def _escape(value: str) -> str:
    """A value fit to sit between double quotes in a pbtxt file."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _parameter_block(key: str, value: str) -> str:
    escaped = _escape(value)
    return f'parameters: {{\n  key: "{key}"\n  value: {{\n    string_value: "{escaped}"\n  }}\n}}\n'


def fill(text: str, values: Mapping[str, str], *, where: str) -> str:
    """Fill placeholders; parameters left unset are dropped (the backend then uses its default)."""

    def drop_unset(match: re.Match[str]) -> str:
        return match.group(0) if match.group("placeholder") in values else ""

    text = COMMENTED_PLACEHOLDER.sub("", text)
    text = PARAMETER_BLOCK.sub(drop_unset, text)
    unresolved = sorted({m.group(1) for m in PLACEHOLDER.finditer(text)} - values.keys())
    if unresolved:
        raise RenderError(f"{where}: unresolved placeholder(s) {', '.join(unresolved)}")
    return PLACEHOLDER.sub(lambda m: _escape(values[m.group(1)]), text)


def template(release: str, name: str) -> Path:
    """The stock ``config.pbtxt`` template of one pipeline model in one release."""
    if name == vision.ENCODER:
        release = vision.ENCODER_RELEASE
    return TEMPLATES / release / name / "config.pbtxt"


def render_config(model: ModelSpec, name: str) -> str:
    """The filled ``config.pbtxt`` of one pipeline model, with prefixed model names."""
    text = template(model.release, name).read_text()
    where = f"model {model.name!r}, {model.release}/{name}/config.pbtxt"
    text = fill(text, template_values(model, name), where=where)
    text = re.sub(r'^name: "\w+"', f'name: "{model.triton_name(name)}"', text, count=1, flags=re.M)
    if name == "tensorrt_llm" and isinstance(model.engine, TorchEngine | LoadTestEngine):
        # Releases before v0.11 write the C++ backend into the template instead of a placeholder.
        text = re.sub(r'^backend: "\w+"', 'backend: "python"', text, count=1, flags=re.M)
    if name == "tensorrt_llm" and isinstance(model.engine, LoadTestEngine):
        text = _instance_count(text, model.engine.instances)
    if name == "ensemble":
        for step in ("preprocessing", "tensorrt_llm", "postprocessing"):
            text = text.replace(f'model_name: "{step}"', f'model_name: "{model.triton_name(step)}"')
        if model.vision_model is not None:
            text = vision.vision_ensemble(text, model)
    if model.vision_model is not None and name in ("preprocessing", "tensorrt_llm_bls"):
        url_input = "IMAGE_URL" if name == "preprocessing" else "image_url_input"
        text = vision.image_url_dims(text, url_input)
    for key, value in _extra_parameters(model, name).items():
        text = _set_parameter(text, key, value)
    return text


def _instance_count(text: str, count: int) -> str:
    """The first ``instance_group``'s ``count`` set to ``count``."""
    return re.sub(
        r"(instance_group\s*\[\s*\{\s*count:\s*)\d+",
        lambda m: m.group(1) + str(count),
        text,
        count=1,
    )


def _set_parameter(text: str, key: str, value: str) -> str:
    """Set a string parameter: replace its value where the template declares it, else append."""
    declared = re.compile(
        r'(parameters:?\s*\{\s*key:\s*"' + re.escape(key) + r'"\s*value:\s*\{\s*string_value:\s*")'
        r'[^"\n]*(")'
    )
    if declared.search(text):
        return declared.sub(lambda m: m.group(1) + _escape(value) + m.group(2), text, count=1)
    return text + "\n" + _parameter_block(key, value)


def render_model(model: ModelSpec) -> dict[str, str]:
    """Every file of one pipeline's five models, by path relative to the repository."""
    files: dict[str, str] = {}
    names = (*PIPELINE_MODELS, vision.ENCODER) if model.vision_model else PIPELINE_MODELS
    for name in names:
        triton_name = model.triton_name(name)
        files[f"{triton_name}/config.pbtxt"] = render_config(model, name)
        if (
            name in PYTHON_MODELS
            or name == vision.ENCODER
            or (name == "tensorrt_llm" and isinstance(model.engine, TorchEngine | LoadTestEngine))
        ):
            files[f"{triton_name}/1/model.py"] = (BACKENDS / name / "model.py").read_text()
        elif name == "tensorrt_llm" or name == "ensemble":
            files[f"{triton_name}/1/.keep"] = ""
    return files


def check_paths(model: ModelSpec) -> None:
    """Fail with the missing path's name when a local model, tokenizer or engine is absent."""
    locations: dict[str, str] = {}
    if isinstance(model.engine, TorchEngine):
        locations["engine.model_dir"] = model.engine.model_dir
    elif isinstance(model.engine, TensorRTLLMEngine):
        locations["engine.engine_dir"] = model.engine.engine_dir
        if model.engine.lora_prefetch_dir:
            locations["engine.lora_prefetch_dir"] = model.engine.lora_prefetch_dir
    elif isinstance(model.engine, LoadTestEngine):
        locations["engine.tokenizer_dir"] = model.engine.tokenizer_dir
    locations["tokenizer_dir"] = model.tokenizer
    if model.vision_model is not None:
        locations["vision_model"] = model.vision_model
    if model.text_python_env is not None:
        locations["text_python_env"] = model.text_python_env
    for field, location in locations.items():
        if looks_like_path(location) and not Path(location).expanduser().is_dir():
            raise RenderError(f"model {model.name!r}: {field} {location} does not exist")


def render_files(spec: Spec, sidecar: SidecarSpec) -> dict[str, str]:
    """Every file of the repository one sidecar serves."""
    files: dict[str, str] = {}
    for model in spec.models_of(sidecar):
        # Built-in names become folders here: the models inside tritonserver never see them.
        model = resolve_model(sidecar_model(model, sidecar))
        check_paths(model)
        files.update(render_model(model))
    return files


def write_repository(files: Mapping[str, str], out_dir: Path) -> Path:
    """Write rendered files to ``out_dir``, replacing what was there once all are written."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for rel, content in files.items():
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out_dir.exists():
        shutil.rmtree(out_dir)
    staging.rename(out_dir)
    return out_dir


def render_spec(spec: Spec, out_dir: Path) -> dict[str, Path]:
    """Render one repository per sidecar under ``out_dir``; returns sidecar name -> folder."""
    return {
        sidecar.name: write_repository(render_files(spec, sidecar), Path(out_dir) / sidecar.name)
        for sidecar in spec.sidecars
    }
