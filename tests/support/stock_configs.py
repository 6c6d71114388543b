"""Stock TensorRT-LLM model configs as Triton returns them, plus variants of other releases."""

from __future__ import annotations

import copy
import string
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from tests.support import REPO

TEMPLATES = REPO / "deploy" / "sidecar" / "templates"
COUNT_INPUTS = ("return_num_input_tokens", "return_num_output_tokens")
COUNT_OUTPUTS = ("num_input_tokens", "num_output_tokens")

Config = dict[str, Any]


def stock(name: str, *, release: str = "latest", decoupled: bool = True, **values: str) -> Config:
    """A release's stock ``<name>`` config filled like ``fill_template.py``, as
    ``get_model_config`` JSON.

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
    text = string.Template((TEMPLATES / release / name / "config.pbtxt").read_text())
    message = text_format.Parse(text.safe_substitute(filled), model_config_pb2.ModelConfig())
    return {"config": json_format.MessageToDict(message, preserving_proto_field_name=True)}


def without_token_counts(document: Config) -> Config:
    """The May 2025 layout: new input names, no token-count tensors yet."""
    result = without_inputs(document, *COUNT_INPUTS)
    config = result["config"]
    config["output"] = [entry for entry in config["output"] if entry["name"] not in COUNT_OUTPUTS]
    return result


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
