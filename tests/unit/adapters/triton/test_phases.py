"""One phase of a disaggregated request through the ``tensorrt_llm`` entry: what the adapter
sends (the handoff input, a context phase answered once), what it reads back (the handoff), and
what it refuses before anything is sent."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from adapters.contract import BeamSearch, InvalidRequest
from adapters.triton.config import parse_model_config
from adapters.triton.grpc.stream import infer_request
from adapters.triton.http.wire import generate_body
from adapters.triton.responses import EngineDecoder, merge_chunks
from adapters.triton.tensors import build_inputs, requested_outputs, streams
from tests.support.stock_configs import stock
from tests.unit.adapters.triton.test_engine_entry import CharStream, engine_request

HANDOFF = b"TPCP\x01{}"


def _with_handoff_input(config: dict[str, Any]) -> dict[str, Any]:
    extra = {"name": "context_phase_params", "data_type": "TYPE_UINT8", "dims": ["-1"]}
    inner = config["config"]
    return {**config, "config": {**inner, "input": [*inner["input"], extra]}}


SPLITTING = parse_model_config(stock("tensorrt_llm"))
BEFORE_SPLITS = parse_model_config(stock("tensorrt_llm", release="v0.11"))
ENSEMBLE = parse_model_config(_with_handoff_input(stock("ensemble")))


def test_the_generation_phase_sends_the_handoff_as_uint8() -> None:
    request = dataclasses.replace(
        engine_request(), phase="generation_only", context_phase_params=HANDOFF
    )
    sent = {tensor.name: tensor for tensor in build_inputs(request, SPLITTING)}
    handoff = sent["context_phase_params"]
    assert handoff.datatype == "UINT8"
    assert handoff.array.shape == (1, len(HANDOFF))
    assert handoff.raw_bytes() == HANDOFF
    assert streams(request, SPLITTING)


def test_the_context_phase_is_answered_once_with_its_handoff() -> None:
    request = dataclasses.replace(engine_request(stream=True), phase="context_only")
    sent = {tensor.name: tensor for tensor in build_inputs(request, SPLITTING)}
    assert "context_phase_params" not in sent
    assert not streams(request, SPLITTING)
    assert sent["streaming"].array.tolist() == [[False]]
    assert "context_phase_params" in requested_outputs(request, SPLITTING)
    assert "context_phase_params" not in requested_outputs(engine_request(), SPLITTING)


def test_the_phase_travels_as_the_request_type_parameter() -> None:
    message = infer_request("m", "r", [], None, request_type="context_only")
    assert message.parameters["request_type"].string_param == "context_only"
    assert "request_type" not in infer_request("m", "r", [], None).parameters
    assert b'"request_type":"generation_only"' in generate_body(
        "r", [], request_type="generation_only"
    )
    assert b"parameters" not in generate_body("r", [])


@pytest.mark.parametrize(
    ("model", "fields", "refusal"),
    [
        (BEFORE_SPLITS, {"phase": "context_only"}, "does not serve disaggregated requests"),
        (ENSEMBLE, {"phase": "context_only"}, "does not serve disaggregated requests"),
        (SPLITTING, {"phase": "generation_only"}, "needs the context phase's handoff"),
        (SPLITTING, {"context_phase_params": HANDOFF}, "needs the context phase's handoff"),
        (
            SPLITTING,
            {"phase": "context_only", "context_phase_params": HANDOFF},
            "needs the context phase's handoff",
        ),
    ],
)
def test_a_phase_the_model_or_request_cannot_take_is_refused(
    model: Any, fields: dict[str, Any], refusal: str
) -> None:
    request = dataclasses.replace(engine_request(), **fields)
    with pytest.raises(InvalidRequest, match=refusal):
        build_inputs(request, model)


def test_beam_search_is_not_split() -> None:
    beam = dataclasses.replace(engine_request().params, beam=BeamSearch(2))
    request = dataclasses.replace(engine_request(), phase="context_only", params=beam)
    with pytest.raises(InvalidRequest, match="beam search cannot be split") as caught:
        build_inputs(request, SPLITTING)
    assert caught.value.param == "n"


def test_the_context_answer_carries_its_handoff() -> None:
    decoder = EngineDecoder(CharStream(), prompt_tokens=2)
    outputs: dict[str, npt.NDArray[Any]] = {
        "output_ids": np.array([[[104]]], dtype=np.int32),
        "context_phase_params": np.frombuffer(HANDOFF, np.uint8).reshape(1, -1),
    }
    chunk = decoder.decode(outputs, final=True)
    assert (chunk.text, chunk.context_phase_params) == ("h", HANDOFF)
    assert merge_chunks([chunk]).context_phase_params == HANDOFF
    assert decoder.decode({"output_ids": outputs["output_ids"]}).context_phase_params is None
