"""The beam-search inputs sent to each entry of the stock v0.19 layout, and what is refused."""

from __future__ import annotations

import pytest

from adapters.contract import BeamSearch, InvalidRequest
from adapters.triton.beams import beam_inputs
from adapters.triton.config import parse_model_config
from tests.support.stock_configs import stock


@pytest.mark.parametrize("name", ["ensemble", "tensorrt_llm_bls"])
def test_log_probs_per_beam_are_refused_where_only_texts_return(name: str) -> None:
    model = parse_model_config(stock(name, release="v0.19"))
    beam = BeamSearch(width=2)
    assert [t.name for t in beam_inputs(beam, model, logprobs=False)] == ["beam_width"]
    with pytest.raises(InvalidRequest) as caught:
        beam_inputs(beam, model, logprobs=True)
    assert caught.value.param == "logprobs"


def test_the_engine_entry_takes_beams_with_log_probs_and_its_own_input_names() -> None:
    model = parse_model_config(
        stock("tensorrt_llm", release="v0.19", triton_backend="python", max_beam_width="4")
    )
    beam = BeamSearch(width=4, length_penalty=1.0, early_stopping=0)
    tensors = {t.name: t.array.item() for t in beam_inputs(beam, model, logprobs=True)}
    assert tensors == {"beam_width": 4, "len_penalty": 1.0, "early_stopping": False}
    with pytest.raises(InvalidRequest, match="max_beam_width is 4") as caught:
        beam_inputs(BeamSearch(width=5, param="best_of"), model, logprobs=True)
    assert caught.value.param == "best_of"


def test_the_stock_ensemble_has_no_early_stopping_input() -> None:
    model = parse_model_config(stock("ensemble", release="v0.19"))
    with pytest.raises(InvalidRequest) as caught:
        beam_inputs(BeamSearch(width=2, early_stopping=0), model, logprobs=False)
    assert caught.value.param == "early_stopping"
