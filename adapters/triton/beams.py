"""The beam-search inputs of a request: ``beam_width`` and what shapes the search, each sent only
where the entry model declares it, or refused naming the request field; and the beams of the
engine's answer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from adapters.contract import BeamSearch, InvalidRequest
from adapters.triton.config import ModelInputs
from adapters.triton.tensors import first_input
from adapters.triton.wire import WireTensor

Outputs = Mapping[str, npt.NDArray[Any]]

_NEVER = 2
"""TensorRT-LLM's ``early_stopping`` above 1 (transformers' ``"never"``): an int input only."""
_ENGINE_DEFAULT_EARLY_STOPPING = 1


def beam_inputs(beam: BeamSearch, model: ModelInputs, *, logprobs: bool) -> list[WireTensor]:
    """``beam_width``, the length penalty and early stopping for ``model``. Log probs per beam
    need each beam's token count, which only the engine's ids give: the text entries return
    each beam's text and ``output_log_probs`` row padded to the longest beam, and their
    ``num_output_tokens`` (where they have it) sums every beam's."""
    if logprobs and not model.is_engine:
        raise InvalidRequest(
            "logprobs cannot be combined with use_beam_search on this model: it returns each "
            "beam's text, not its tokens, so log probs cannot be matched to tokens.",
            param="logprobs",
            detail=f"Triton model {model.name} is not the engine; the tensorrt_llm entry returns "
            "log probs per beam",
        )
    if "beam_width" not in model.accepted:
        raise InvalidRequest(
            "use_beam_search is not supported by this model.",
            param="use_beam_search",
            detail=f"Triton model {model.name} has no beam_width input",
        )
    if model.max_beam_width is not None and beam.width > model.max_beam_width:
        raise InvalidRequest(
            f"{beam.param} asks for {beam.width} beams, but this deployment's max_beam_width is "
            f"{model.max_beam_width}.",
            param=beam.param,
        )
    tensors = [WireTensor("beam_width", "INT32", np.array([[beam.width]], np.int32))]
    if beam.length_penalty is not None:
        spec = first_input(model, ("length_penalty", "len_penalty"))
        if spec is None:
            raise InvalidRequest(
                "length_penalty is not supported by this model.",
                param="length_penalty",
                detail=f"Triton model {model.name} has no length penalty input",
            )
        tensors.append(WireTensor(spec.name, "FP32", np.array([[beam.length_penalty]], np.float32)))
    early = beam.early_stopping
    if early is not None and early != _ENGINE_DEFAULT_EARLY_STOPPING:
        tensors.append(_early_stopping(early, model))
    return tensors


def _early_stopping(value: int, model: ModelInputs) -> WireTensor:
    spec = model.inputs.get("early_stopping") if "early_stopping" in model.accepted else None
    if spec is None:
        raise InvalidRequest(
            "early_stopping is not supported by this model, which always stops early.",
            param="early_stopping",
            detail=f"Triton model {model.name} has no early_stopping input, and its engine "
            "stops early (TensorRT-LLM's default, early_stopping true)",
        )
    if spec.datatype == "BOOL":
        if value == _NEVER:
            raise InvalidRequest(
                "early_stopping 'never' is not supported by this model; send true or false.",
                param="early_stopping",
                detail=f"Triton model {model.name} takes early_stopping as a bool",
            )
        return WireTensor(spec.name, "BOOL", np.array([[bool(value)]], np.bool_))
    return WireTensor(spec.name, "INT32", np.array([[value]], np.int32))


def beam_rows(outputs: Outputs) -> list[tuple[list[int], npt.NDArray[np.float64]]]:
    """Each beam's ids (``[1, beams, tokens]`` cut to ``sequence_length`` ``[1, beams]``) and its
    row of ``output_log_probs`` (empty where not returned)."""
    tokens = outputs.get("output_ids")
    if tokens is None or tokens.size == 0:
        return []
    rows = tokens.reshape(-1, tokens.shape[-1])
    lengths = outputs.get("sequence_length")
    ends = [row.size for row in rows] if lengths is None else lengths.reshape(-1).tolist()
    log_probs = outputs.get("output_log_probs")
    probs = (
        np.asarray(log_probs, np.float64).reshape(len(rows), -1)
        if log_probs is not None and log_probs.size
        else np.zeros((len(rows), 0))
    )
    return [(rows[k, : ends[k]].tolist(), probs[k]) for k in range(len(rows))]
