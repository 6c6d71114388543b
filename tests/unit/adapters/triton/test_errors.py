"""Failure classification: Triton and TensorRT-LLM messages and gRPC codes to contract errors."""

from __future__ import annotations

import logging

import pytest

from adapters.contract import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    BeamSearch,
    Guide,
    InferenceFailed,
    InvalidRequest,
    LoraNotCached,
    ModelNotFound,
)
from adapters.triton.errors import classify, refusal_named
from gateway.errors import from_backend_error, to_api_error
from gateway.observability.logs import RequestIdFilter
from gateway.observability.record import RequestRecord, current_request

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
        # A dead stub, as an ensemble answers over HTTP (400) and as a BLS passes it on.
        ("in ensemble 'tiny_ensemble', Stub process 'tiny_tensorrt_llm_0_0' is not healthy.",
         "INVALID_ARGUMENT", BackendUnavailable),
        ("tiny_tensorrt_llm: Stub process 'tiny_tensorrt_llm_0_0' is not healthy.",
         "StatusCode.INTERNAL", BackendUnavailable),
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
    if isinstance(error, InvalidRequest):
        assert error.detail == message and message not in str(error)
    else:
        assert str(error) == message


@pytest.mark.parametrize(
    "message",
    [
        "beam_width 4 is outside [1, max_beam_width 1] of the model",
        "Failed to process the request(s) for model 'ensemble_0_0', message: EngineError: "
        "beam_width 8 is outside [1, max_beam_width 4] of the model",
        "beam_width 4 exceeds torch_max_batch_size (2): every beam takes a row of the batch",
        "[TensorRT-LLM][ERROR] Assertion failed: Requested beam width 4 is larger than configured "
        "max beam width 1 (trtGptModelInflightBatching.cpp:1203)",
    ],
)
@pytest.mark.parametrize(
    ("beam", "param"),
    [(BeamSearch(width=4), "n"), (BeamSearch(width=4, param="best_of"), "best_of")],
)
def test_an_engine_refused_beam_width_is_a_400_naming_the_request_field(
    message: str, beam: BeamSearch, param: str
) -> None:
    error = classify(message, "StatusCode.INTERNAL")
    assert isinstance(error, InvalidRequest)

    named = refusal_named(error, None, beam)
    assert named is not None and named.param == param and named.detail == message
    answer = from_backend_error(named, retry_after_s=1)
    assert answer.status_code == 400 and answer.param == param


def test_other_refusals_keep_their_param_under_a_beam_search() -> None:
    refusal = classify("temperature must not be negative")
    assert isinstance(refusal, InvalidRequest)
    assert refusal_named(refusal, None, BeamSearch(width=2)) is None


LATE_GRAMMAR = (
    "guided_decoding_guide (guide type json_schema) did not compile within 1 s, the limit "
    "guided_decoding_compile_timeout_ms sets: send a smaller or shallower grammar"
)
BUSY_GRAMMAR = (
    "guided_decoding_guide (guide type json_schema) waited for one of the engine's 2 grammar "
    "compile slots and did not compile within 1 s, the limit guided_decoding_compile_timeout_ms "
    "sets: the compile slots were busy"
)


TRITON_REFUSAL = (
    'request 8adc51f0c2-0-3 to smollm2_ensemble: data: {"error":"in ensemble '
    "'smollm2_ensemble', [request id: 8adc51f0c2-0-3] unexpected shape for input 'top_k' for "
    "model 'tensorrt_llm'. Expected [-1,1], got [1,2]\"}"
)


@pytest.mark.parametrize(
    "message",
    [
        LATE_GRAMMAR,
        f"in ensemble 'tiny_ensemble', {LATE_GRAMMAR}",
        BUSY_GRAMMAR,
        "invalid guided_decoding_guide for guide type json_schema: Unsupported keyword",
    ],
)
@pytest.mark.parametrize(
    ("guide", "param"),
    [
        (Guide("json_schema", "{}"), "response_format"),
        (Guide("json_schema", "{}", param="tool_choice"), "tools"),
        (Guide("structural_tag", "{}", param="tool_choice", optional=True), "tools"),
    ],
)
def test_a_refused_grammar_is_a_400_naming_the_field_it_was_made_of(
    message: str, guide: Guide, param: str
) -> None:
    error = classify(message, "StatusCode.INTERNAL")
    assert isinstance(error, InvalidRequest)

    named = refusal_named(error, guide, None)
    assert named is not None and named.param == param and named.detail == message
    assert "response_format" in str(named) and "ensemble" not in str(named)
    answer = from_backend_error(named, retry_after_s=1)
    assert answer.status_code == 400 and answer.param == param


def test_other_refusals_keep_their_param_under_a_guide() -> None:
    refusal = classify("temperature must not be negative")
    assert isinstance(refusal, InvalidRequest)
    assert refusal_named(refusal, Guide("json"), None) is None


def test_a_refusal_is_named_only_by_the_field_of_its_own_kind() -> None:
    grammar = classify(LATE_GRAMMAR)
    assert isinstance(grammar, InvalidRequest)
    assert refusal_named(grammar, None, BeamSearch(width=2)) is None


@pytest.mark.parametrize(
    ("message", "status"),
    [
        (TRITON_REFUSAL, "INVALID_ARGUMENT"),
        ("request 8adc-0-3 to smollm2_ensemble: Prompt length (90) exceeds maximum input length "
         "(64).", None),
        ("request 8adc-0-3 to smollm2_ensemble: in ensemble 'smollm2_ensemble': anything",
         "StatusCode.INVALID_ARGUMENT"),
        ("[request id: 8adc-0-3] guided_decoding_guide_type 'json' for model 'smollm2_bls'", None),
    ],
)  # fmt: skip
def test_a_refusal_tells_the_client_no_internals_and_logs_them_under_the_request_id(
    message: str, status: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    token = current_request.set(RequestRecord("client-7", "POST", "/v1/chat/completions"))
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.errors"):
            error = to_api_error(classify(message, status))
        (logged,) = caplog.records
        RequestIdFilter().filter(logged)  # as the log handler does while the request runs
    finally:
        current_request.reset(token)
    body = error.envelope().error
    assert error.status_code == 400 and body.type == "invalid_request_error"
    assert body.code is not None and body.message
    for internal in ("smollm2", "8adc", "request id", "data:", "tensorrt_llm", "ensemble"):
        assert internal not in body.message
    assert message in logged.getMessage() and logged.request_id == "client-7"


def test_a_grammar_that_waited_for_a_busy_compiler_is_told_to_try_again() -> None:
    waited, late = classify(BUSY_GRAMMAR), classify(LATE_GRAMMAR)
    assert "busy" in str(waited) and "try again" in str(waited)
    assert "busy" not in str(late)
