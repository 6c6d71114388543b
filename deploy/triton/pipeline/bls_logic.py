"""Pure request logic of our BLS: validation, tensor routing, stop words and streamed text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from deploy.triton.pipeline.detokenizer import IncrementalDetokenizer
from deploy.triton.pipeline.tokenization import as_text

Arrays = Mapping[str, npt.NDArray[Any]]

PREPROCESSING_INPUTS = {
    "text_input": "QUERY",
    "decoder_text_input": "DECODER_QUERY",
    "max_tokens": "REQUEST_OUTPUT_LEN",
    "bad_words": "BAD_WORDS_DICT",
    "stop_words": "STOP_WORDS_DICT",
    "embedding_bias_words": "EMBEDDING_BIAS_WORDS",
    "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS",
    "end_id": "END_ID",
    "pad_id": "PAD_ID",
    "prompt_table_extra_id": "PROMPT_TABLE_EXTRA_ID",
}
PREPROCESSING_TO_ENGINE = {
    "INPUT_ID": "input_ids",
    "REQUEST_INPUT_LEN": "input_lengths",
    "REQUEST_OUTPUT_LEN": "request_output_len",
    "BAD_WORDS_IDS": "bad_words_list",
    "STOP_WORDS_IDS": "stop_words_list",
    "EMBEDDING_BIAS": "embedding_bias",
    "OUT_END_ID": "end_id",
    "OUT_PAD_ID": "pad_id",
    "DECODER_INPUT_ID": "decoder_input_ids",
    "REQUEST_DECODER_INPUT_LEN": "decoder_input_lengths",
    "OUT_PROMPT_TABLE_EXTRA_IDS": "prompt_table_extra_ids",
}
ENGINE_RENAMES = {
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "length_penalty": "len_penalty",
    "stream": "streaming",
}
IMAGE_INPUTS = ("image_input", "image_bytes_input", "image_url_input", "video_bytes_input")
IMAGE_PREPROCESSING_INPUTS = {"image_bytes_input": "IMAGE_BYTES", "image_url_input": "IMAGE_URL"}
NO_ENCODER = (
    "multimodal inputs are not supported: this model takes no images (its BLS has no "
    "multimodal_encoders_name: the pipeline has no vision model)"
)
ENCODER_TO_ENGINE = {
    "OUT_PROMPT_EMBEDDING_TABLE": "prompt_embedding_table",
    "OUT_PROMPT_VOCAB_SIZE": "prompt_vocab_size",
}
SPECULATIVE_INPUTS = ("num_draft_tokens", "use_draft_logits")
ENGINE_ALWAYS = ("output_ids", "sequence_length")
TEXT_OUTPUT = "text_output"
BATCH_ONE_MESSAGE = "Inflight batching backend expects requests with batch size of 1."


class RequestError(ValueError):
    """A request the BLS rejects before running anything."""


def first(value: npt.NDArray[Any] | None, default: Any = None) -> Any:
    """The single element of a `[1, 1]`-like tensor, or the default when absent or empty."""
    if value is None or value.size == 0:
        return default
    return value.reshape(-1)[0].item() if value.dtype != np.object_ else value.reshape(-1)[0]


@dataclass(frozen=True)
class Dispatch:
    """What one validated BLS request asks for."""

    streaming: bool
    stop_words: tuple[str, ...]
    num_sequences: int
    preprocessing_inputs: dict[str, npt.NDArray[Any]]
    preprocessing_outputs: tuple[str, ...]
    engine_inputs: dict[str, npt.NDArray[Any]]
    image_input: npt.NDArray[Any] | None = None
    """Processed images (``image_input``) for the encoder, when the client sent them."""
    vision: bool = False
    """Whether the request carries images for the ``multimodal_encoders`` model."""


def plan_request(inputs: Arrays, *, decoupled: bool, vision: bool = False) -> Dispatch:
    """Validate a BLS request (stock messages) and route its tensors to the three steps (four
    with images and a ``multimodal_encoders`` model: ``vision``)."""
    _validate(inputs, decoupled=decoupled, vision=vision)
    routes = PREPROCESSING_INPUTS | (IMAGE_PREPROCESSING_INPUTS if vision else {})
    preprocessing = {routes[name]: value for name, value in inputs.items() if name in routes}
    wanted = [k for k in PREPROCESSING_TO_ENGINE if k not in _ABSENT_UNLESS_ASKED]
    images = vision and any(
        name in inputs and inputs[name].size
        for name in (*IMAGE_PREPROCESSING_INPUTS, "image_input")
    )
    if images:
        wanted.append("PIXEL_VALUES")
    if "decoder_text_input" in inputs:
        wanted += ["DECODER_INPUT_ID", "REQUEST_DECODER_INPUT_LEN"]
    if "prompt_table_extra_id" in inputs:
        wanted.append("OUT_PROMPT_TABLE_EXTRA_IDS")
    engine = {
        ENGINE_RENAMES.get(name, name): _batched(value)
        for name, value in inputs.items()
        if name not in PREPROCESSING_INPUTS
        and name not in IMAGE_INPUTS
        and name not in SPECULATIVE_INPUTS
    }
    stop_words = inputs.get("stop_words")
    words = () if stop_words is None else tuple(as_text(w) for w in stop_words.reshape(-1))
    return Dispatch(
        streaming=bool(first(inputs.get("stream"), False)),
        stop_words=tuple(w for w in words if w),
        num_sequences=max(1, int(first(inputs.get("num_return_sequences"), 1))),
        preprocessing_inputs=preprocessing,
        preprocessing_outputs=tuple(wanted),
        engine_inputs=engine,
        image_input=inputs.get("image_input") if images else None,
        vision=images,
    )


_ABSENT_UNLESS_ASKED = (
    "DECODER_INPUT_ID",
    "REQUEST_DECODER_INPUT_LEN",
    "OUT_PROMPT_TABLE_EXTRA_IDS",
)


def _validate(inputs: Arrays, *, decoupled: bool, vision: bool) -> None:
    text = inputs.get("text_input")
    if text is None or text.size == 0:
        raise RequestError("text_input is required")
    if any(value.ndim > 0 and value.shape[0] != 1 for value in inputs.values()):
        raise RequestError(BATCH_ONE_MESSAGE)
    max_tokens = inputs.get("max_tokens")
    if max_tokens is None or max_tokens.size != 1 or int(first(max_tokens)) <= 0:
        raise RequestError("max_tokens must be a single value > 0")
    for name in IMAGE_INPUTS:
        if name in inputs and inputs[name].size:
            if not vision:
                raise RequestError(NO_ENCODER)
            if name == "video_bytes_input":
                raise RequestError("video inputs are not supported by this BLS")
    if int(first(inputs.get("num_draft_tokens"), 0)) > 0:
        raise RequestError("speculative decoding is not supported by this BLS")
    if bool(first(inputs.get("stream"), False)) and not decoupled:
        raise RequestError("Streaming is only supported in decoupled mode.")
    if int(first(inputs.get("num_return_sequences"), 1)) > 1 and not decoupled:
        raise RequestError("num_return_sequences > 1 requires the decoupled mode")


def _batched(value: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Inputs declared with `reshape: [ ]` arrive as `[1]`; the engine expects `[1, 1]`."""
    return value.reshape(1, 1) if value.ndim == 1 else value


def engine_inputs(plan: Dispatch, preprocessed: Arrays) -> dict[str, npt.NDArray[Any]]:
    """The engine request: non-empty preprocessing outputs plus the passed-through inputs."""
    routed = {
        PREPROCESSING_TO_ENGINE[name]: value
        for name, value in preprocessed.items()
        if name in PREPROCESSING_TO_ENGINE and value.size > 0
    }
    return routed | plan.engine_inputs


def encoder_inputs(plan: Dispatch, preprocessed: Arrays) -> dict[str, npt.NDArray[Any]] | None:
    """The ``multimodal_encoders`` request (stock names), or None when there are no images."""
    if not plan.vision:
        return None
    inputs = {}
    pixels = preprocessed.get("PIXEL_VALUES")
    if pixels is not None and pixels.size:
        inputs["pixel_values"] = pixels
    if plan.image_input is not None and plan.image_input.size:
        inputs["IMAGE"] = plan.image_input
    return inputs or None


def with_prompt_table(engine: Arrays, encoded: Arrays) -> dict[str, npt.NDArray[Any]]:
    """The engine request with the encoder's prompt table and its size."""
    table = {
        ENCODER_TO_ENGINE[name]: value
        for name, value in encoded.items()
        if name in ENCODER_TO_ENGINE
    }
    return dict(engine) | table


def engine_outputs(requested: Sequence[str]) -> list[str]:
    """Engine outputs to ask for: ids and lengths, plus whatever the client wants passed through."""
    extra = [name for name in requested if name != TEXT_OUTPUT and name not in ENGINE_ALWAYS]
    return [*ENGINE_ALWAYS, *extra]


def stop_cut(text: str, stop_words: Sequence[str], *, start: int = 0) -> int | None:
    """The end index of the earliest stop word ending at or after ``start``; None if none."""
    ends = []
    for word in stop_words:
        index = text.find(word, max(0, start - len(word) + 1))
        if index >= 0:
            ends.append(index + len(word))
    return min(ends) if ends else None


def truncate_at_stop(text: str, stop_words: Sequence[str], *, start: int = 0) -> tuple[str, bool]:
    """Text cut just after its first stop word (searching from ``start``), and whether it was."""
    cut = stop_cut(text, stop_words, start=start)
    return (text, False) if cut is None else (text[:cut], True)


@dataclass
class SequenceText:
    """The streamed text of one returned sequence: deltas or cumulative text, stop words applied."""

    accumulate: bool
    stop_words: tuple[str, ...] = ()
    detokenizer: IncrementalDetokenizer = field(default_factory=IncrementalDetokenizer)
    text: str = ""
    stopped: bool = False

    def emit(self, delta: str) -> str:
        """What to send for a new delta: the delta (cut at a stop word) or the text so far."""
        if self.stopped:
            return self.text if self.accumulate else ""
        start = len(self.text)
        combined = self.text + delta
        cut = stop_cut(combined, self.stop_words, start=start) if self.stop_words else None
        if cut is not None:
            combined = combined[:cut]
            self.stopped = True
        new = combined[start:]
        self.text = combined
        return self.text if self.accumulate else new


def prompt_text_length(
    output_ids: Sequence[int], input_ids: Sequence[int], prompt_text: str, full_text: str
) -> int:
    """Where generated text starts in a non-streamed text that may echo the prompt."""
    echoed = len(output_ids) >= len(input_ids) and list(output_ids[: len(input_ids)]) == list(
        input_ids
    )
    return len(prompt_text) if echoed and full_text.startswith(prompt_text) else 0
