"""The ``context_phase_params`` byte string and the request-type rules of disaggregated serving."""

from __future__ import annotations

import pytest

from deploy.triton.engine.disagg.phase import (
    MAGIC,
    VERSION,
    BadContextPhase,
    ContextPhaseParams,
    RequestType,
    refusal,
)

PARAMS = ContextPhaseParams(
    address="unix-abstract:trtllm-kv-1-ab",
    handoff_id="0f" * 16,
    first_tokens=(42,),
    prompt_length=70,
    tokens_per_block=16,
    model_key="tiny|torch.float32",
    bytes_per_token=1024,
)


def test_the_byte_string_round_trips_under_its_magic_and_version() -> None:
    data = PARAMS.encode()
    assert data[: len(MAGIC)] == MAGIC and data[len(MAGIC)] == VERSION
    assert ContextPhaseParams.decode(data) == PARAMS


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not the output of a context_only request"),
        (b"TPC", "not the output of a context_only request"),
        (b"XXXX\x01{}", "not the output of a context_only request"),
        (MAGIC + bytes([VERSION + 1]) + b"{}", f"has version {VERSION + 1}"),
        (MAGIC + bytes([0]) + b"{}", "has version 0"),
        (MAGIC + bytes([VERSION]) + b"{}", "malformed"),
        (MAGIC + bytes([VERSION]) + b"\xff", "malformed"),
        (MAGIC + bytes([VERSION]) + b'{"address": 1}', "malformed"),
    ],
)
def test_an_unknown_version_or_a_foreign_string_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(BadContextPhase, match=message):
        ContextPhaseParams.decode(data)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, RequestType.CONTEXT_AND_GENERATION),
        ("", RequestType.CONTEXT_AND_GENERATION),
        ("context_only", RequestType.CONTEXT_ONLY),
        ("generation_only", RequestType.GENERATION_ONLY),
    ],
)
def test_request_types_are_tensorrt_llms(value: object, kind: RequestType) -> None:
    assert RequestType.parse(value) is kind


def test_an_unknown_request_type_names_the_known_ones() -> None:
    with pytest.raises(BadContextPhase, match="context_and_generation, context_only"):
        RequestType.parse("prefill")


WHOLE, CONTEXT, GENERATION = RequestType


@pytest.mark.parametrize(
    ("kind", "inputs", "reason"),
    [
        (WHOLE, {}, None),
        (WHOLE, {"has_params": True}, "read only by a generation_only"),
        (CONTEXT, {}, None),
        (CONTEXT, {"has_params": True}, "read only by a generation_only"),
        (CONTEXT, {"streaming": True}, "answers once"),
        (CONTEXT, {"rows": 2}, "beam search"),
        (GENERATION, {"has_params": True}, None),
        (GENERATION, {"has_params": True, "streaming": True}, None),
        (GENERATION, {}, "needs the context_phase_params"),
        (GENERATION, {"has_params": True, "rows": 4}, "beam search"),
        (GENERATION, {"has_params": True, "context_logits": True}, "no context logits"),
    ],
)
def test_refusals(kind: RequestType, inputs: dict[str, object], reason: str | None) -> None:
    values = {"has_params": False, "streaming": False, "rows": 1, "context_logits": False}
    found = refusal(kind, **(values | inputs))  # type: ignore[arg-type]
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found
