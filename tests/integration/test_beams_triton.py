"""Beam search inside tritonserver: the engine model's beam-shaped responses, and beams through
our ensemble and BLS, decoupled and not, streamed and whole (the shared tiny sidecar)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.sidecar.supervisor import Sidecar
from tests.support import engine_grpc
from tests.support.engine import beam_reference
from tests.support.engine_grpc import PROMPT, request
from tests.support.pipeline_calls import Stream, generate

pytestmark = pytest.mark.slow

WIDTH = 3
MAX_NEW = 10
TEXT = "Once upon a time"


@pytest.fixture(scope="module")
def beam_texts(tiny_model_dir: Path, hf_model: Any) -> list[str]:
    """transformers' beams of ``TEXT`` as the pipeline's tokenizer encodes and decodes them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tuple(tokenizer.encode(TEXT))
    beams = beam_reference(hf_model, prompt, WIDTH, MAX_NEW)
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in beams]


def _beam_request(**extra: Any) -> dict[str, Any]:
    return request(MAX_NEW, beam_width=WIDTH, return_log_probs=True, **extra)


def test_the_engine_answers_every_beam_in_one_response(sidecar: Sidecar, hf_model: Any) -> None:
    responses = engine_grpc.Stream(sidecar, _beam_request()).collect()
    ((outputs, final),) = responses
    assert final and "sequence_index" not in outputs
    expected = beam_reference(hf_model, PROMPT, WIDTH, MAX_NEW)
    ids, lengths = outputs["output_ids"], outputs["sequence_length"]
    assert ids.shape[:2] == (1, WIDTH) and lengths.shape == (1, WIDTH)
    beams = [ids[0, k, : lengths[0, k]].tolist() for k in range(WIDTH)]
    assert beams == [[*PROMPT, *tokens] for tokens in expected]
    cum = outputs["cum_log_probs"]
    assert cum.shape == (1, WIDTH) and list(cum[0]) == sorted(cum[0], reverse=True)
    assert outputs["output_log_probs"].shape == (1, WIDTH, MAX_NEW)
    assert np.allclose(outputs["output_log_probs"].sum(axis=-1), cum, atol=1e-4)


def test_a_streamed_beam_search_sends_each_beam_so_far(sidecar: Sidecar) -> None:
    whole = engine_grpc.Stream(sidecar, _beam_request(exclude_input_in_output=True)).collect()
    streamed = engine_grpc.Stream(sidecar, _beam_request(streaming=True)).collect()
    assert [final for _, final in streamed] == [False] * (MAX_NEW - 1) + [True]
    for step, (outputs, _) in enumerate(streamed, start=1):
        assert outputs["sequence_length"].tolist() == [[step] * WIDTH]
    assert streamed[-1][0]["output_ids"].tolist() == whole[0][0]["output_ids"].tolist()


def test_beam_width_beyond_the_models_max_beam_width_is_refused(sidecar: Sidecar) -> None:
    error = engine_grpc.Stream(sidecar, request(4, beam_width=5)).error()
    assert "max_beam_width 4" in error


def _texts(outputs: dict[str, Any]) -> list[str]:
    return [bytes(text).decode() for text in outputs["text_output"].reshape(-1)]


@pytest.mark.parametrize("model", ["tiny_ensemble", "tiny_tensorrt_llm_bls", "tiny3_ensemble"])
def test_pipelines_return_every_beams_text(
    sidecar: Sidecar, model: str, beam_texts: list[str]
) -> None:
    """``tiny3`` is not decoupled (the v0.8 layout); the others are."""
    body = {"text_input": TEXT, "max_tokens": MAX_NEW, "beam_width": WIDTH}
    result = generate(sidecar, model, {**body, "return_log_probs": True})
    assert result["status"] == 200, result
    texts = [text.removeprefix(TEXT) for text in result["text_output"]]
    assert texts == beam_texts
    assert len(result["cum_log_probs"]) == WIDTH


@pytest.mark.parametrize("model", ["tiny_ensemble", "tiny_tensorrt_llm_bls"])
def test_pipelines_stream_every_beams_text_so_far(
    sidecar: Sidecar, model: str, beam_texts: list[str]
) -> None:
    values = {
        "text_input": np.array([[TEXT]]),
        "max_tokens": np.array([[MAX_NEW]], np.int32),
        "beam_width": np.array([[WIDTH]], np.int32),
        "stream": np.array([[True]]),
    }
    chunks = Stream(sidecar, model, values, request_id=f"beams-{model}").collect()
    texts = [_texts(chunk) for chunk in chunks if "text_output" in chunk]
    assert len(texts) == MAX_NEW
    assert all(len(step) == WIDTH for step in texts)
    assert texts[-1] == beam_texts
