"""Small deploy specs and the parsing of rendered configs, for the render and spec tests."""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

TORCH = {"kind": "torch", "model_dir": "some/hub-id"}
TRTLLM = {"kind": "tensorrtllm", "engine_dir": "/engines/llama", "gpu_device_ids": "0,1"}


def one_model_spec(engine: dict[str, object], **model: object) -> dict[str, object]:
    """A spec of one pipeline, ``m1``, on ``engine``."""
    return {"models": [{"name": "m1", "tokenizer_dir": "tok/id", "engine": engine, **model}]}


def parse_config(text: str) -> mc.ModelConfig:
    """A rendered ``config.pbtxt`` as Triton reads it."""
    return text_format.Parse(text, mc.ModelConfig())
