"""Failure classification: Triton and TensorRT-LLM messages and gRPC codes to contract errors."""

from __future__ import annotations

import pytest

from adapters.contract import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    InferenceFailed,
    InvalidRequest,
    LoraNotCached,
    ModelNotFound,
)
from adapters.triton.errors import classify

BLS_TRACEBACK = (
    'Traceback (most recent call last):\n  File "/models/tensorrt_llm_bls/1/model.py", line 9'
    "\ntriton_python_backend_utils.TritonModelException: Executor failed process requestId 3"
    " due to the following error: LoRA task 10 not found in cache. Please send LoRA weights with"
    " request"
)


@pytest.mark.parametrize(
    ("message", "status", "expected"),
    [
        ("LoRA task 10 not found in cache. Please send LoRA weights with request", None,
         LoraNotCached),
        (BLS_TRACEBACK, None, LoraNotCached),
        ("the prompt holds 1 image token(s) but 0 image(s) were sent", None, InvalidRequest),
        ("Failed to process the request(s) for model 'vis_preprocessing', message: "
         "ValueError: the prompt holds 2 image token(s) but 1 image(s) were sent",
         "StatusCode.INTERNAL", InvalidRequest),
        ("[TensorRT-LLM][ERROR] Assertion failed: LoRA task 0 not found in cache. Please send "
         "LoRA weights with request (loraCache.cpp:12)", "StatusCode.INTERNAL", LoraNotCached),
        ("Request for unknown model: 'nope' is not found", None, ModelNotFound),
        ("Request for unknown model: 'nope' is not found", "StatusCode.NOT_FOUND", ModelNotFound),
        ("Request for unknown model: 'm' has no available versions", "UNAVAILABLE",
         BackendUnavailable),
        ("Request for unknown model: 'm' has no available versions", None, BackendUnavailable),
        ("failed to connect to all addresses; Connection refused", "StatusCode.UNAVAILABLE",
         BackendUnavailable),
        ("Socket closed", "UNAVAILABLE", BackendUnavailable),
        ("Exceeds maximum queue size", None, BackendUnavailable),
        ("Server is shutting down", None, BackendUnavailable),
        ("Deadline Exceeded", "StatusCode.DEADLINE_EXCEEDED", BackendTimeout),
        ("Request timeout expired", None, BackendTimeout),
        ("[request id: r] unexpected inference input 'foo' for model 'm'", None, InvalidRequest),
        ("[request id: r] unexpected shape for input 'max_tokens' for model 'm'. Expected [-1,1]",
         None, InvalidRequest),
        ("inference input 'top_k' data-type is 'FP32', but model 'm' expects 'INT32'", None,
         InvalidRequest),
        ("text_input is required", None, InvalidRequest),
        ("max_tokens must be a single value > 0", None, InvalidRequest),
        ("Streaming is only supported if model is deployed using decoupled mode.", None,
         InvalidRequest),
        ("Prompt length (90) exceeds maximum input length (64).", None, InvalidRequest),
        ("anything", "StatusCode.INVALID_ARGUMENT", InvalidRequest),
        ("Invalid low_rank (128). low_rank must be smaller than mMaxLowRank", None, InvalidRequest),
        ("temperature must not be negative", None, InvalidRequest),
        ("request_output_len must be at least 1", None, InvalidRequest),
        ("the prompt has 90 tokens but torch_max_seq_len is 64: no room is left for output", None,
         InvalidRequest),
        ("the request may need 300 KV-cache blocks (its prompt and 4000 new tokens for each of "
         "its 4 sequences), which must not exceed the 256 blocks of the cache", None,
         InvalidRequest),
        ("boom: something", None, InferenceFailed),
        ("CUDA error: an illegal memory access", "StatusCode.INTERNAL", InferenceFailed),
        ("Request was cancelled", "CANCELLED", InferenceFailed),
    ],
)  # fmt: skip
def test_classify(message: str, status: str | None, expected: type[BackendError]) -> None:
    error = classify(message, status)

    assert type(error) is expected
    assert str(error) == message
