"""The Triton Inference Server backend for TensorRT-LLM ``ensemble`` and ``tensorrt_llm_bls``."""

from adapters.triton.client import TritonBackend
from adapters.triton.config import ModelInputs, TensorSpec, parse_model_config
from adapters.triton.grpc.stream import map_triton_errors

__all__ = ["ModelInputs", "TensorSpec", "TritonBackend", "map_triton_errors", "parse_model_config"]
