"""PyTorch stand-in for TensorRT-LLM: in-flight batching generation over Hugging Face causal LMs."""

from deploy.engine.scheduler import Engine, validate_request
from deploy.engine.types import (
    EngineConfig,
    EngineError,
    EngineStats,
    FinishReason,
    GenerationRequest,
    OutputCallback,
    SamplingParams,
    SequenceOutput,
)

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineStats",
    "FinishReason",
    "GenerationRequest",
    "OutputCallback",
    "SamplingParams",
    "SequenceOutput",
    "validate_request",
]
