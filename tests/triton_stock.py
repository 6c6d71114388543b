"""Stock TensorRT-LLM model configs as Triton returns them, plus variants of other releases."""

from __future__ import annotations

import copy
import string
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

TEMPLATES = Path(__file__).resolve().parents[1] / "deploy" / "templates"

Config = dict[str, Any]


def stock(name: str, *, decoupled: bool = True, **values: str) -> Config:
    """``deploy/templates/<name>`` filled like ``fill_template.py``, as ``get_model_config`` JSON.

    Placeholders not given stay ``${...}`` inside string parameters, as they do in the field.
    """
    filled = {
        "triton_max_batch_size": "4",
        "decoupled_mode": "true" if decoupled else "false",
        "logits_datatype": "TYPE_FP32",
        "encoder_input_features_data_type": "TYPE_FP16",
        "prompt_embedding_table_data_type": "TYPE_FP16",
        "preprocessing_instance_count": "1",
        "postprocessing_instance_count": "1",
        "bls_instance_count": "1",
        "max_queue_delay_microseconds": "0",
        "max_queue_size": "0",
        **values,
    }
    text = string.Template((TEMPLATES / name / "config.pbtxt").read_text())
    message = text_format.Parse(text.safe_substitute(filled), model_config_pb2.ModelConfig())
    return {"config": json_format.MessageToDict(message, preserving_proto_field_name=True)}


def with_token_counts(document: Config) -> Config:
    """A mid-2025+ release: ``return_num_*`` inputs and ``num_*_tokens`` outputs."""
    result = copy.deepcopy(document)
    config = result["config"]
    for name in ("return_num_input_tokens", "return_num_output_tokens"):
        config["input"].append(
            {"name": name, "data_type": "TYPE_BOOL", "dims": ["1"], "optional": True}
        )
    for name in ("num_input_tokens", "num_output_tokens"):
        config["output"].append({"name": name, "data_type": "TYPE_INT32", "dims": ["1"]})
    return result


def as_release_0_19(document: Config) -> Config:
    """A release up to v0.19: ``min_length`` and ``random_seed`` instead of the new names."""
    return renamed(document, {"min_tokens": "min_length", "seed": "random_seed"})


def as_release_0_15(document: Config) -> Config:
    """A release before v0.16: old names and no ``exclude_input_in_output`` input."""
    return without_inputs(as_release_0_19(document), "exclude_input_in_output")


def renamed(document: Config, names: dict[str, str]) -> Config:
    """The config with inputs renamed."""
    result = copy.deepcopy(document)
    for entry in result["config"]["input"]:
        entry["name"] = names.get(entry["name"], entry["name"])
    return result


def without_inputs(document: Config, *names: str) -> Config:
    """The config without the named inputs."""
    result = copy.deepcopy(document)
    config = result["config"]
    config["input"] = [entry for entry in config["input"] if entry["name"] not in names]
    return result


def with_lora_columns(document: Config, columns: int, dtype: str = "TYPE_FP16") -> Config:
    """The config with ``lora_config`` dims ``[-1, columns]`` and ``lora_weights`` of ``dtype``."""
    result = copy.deepcopy(document)
    for entry in result["config"]["input"]:
        if entry["name"] == "lora_config":
            entry["dims"] = ["-1", str(columns)]
        if entry["name"] == "lora_weights":
            entry["data_type"] = dtype
    return result
