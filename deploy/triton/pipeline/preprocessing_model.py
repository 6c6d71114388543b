"""The `preprocessing` Triton model: prompt and word lists to token tensors (stock contract)."""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import numpy.typing as npt
import triton_python_backend_utils as pb_utils

from deploy.triton import params
from deploy.triton.pipeline import tokenization as tk

logger = logging.getLogger(__name__)

IMAGE_INPUTS = ("IMAGE_URL", "IMAGE_BYTES", "VIDEO_BYTES")


class TritonPythonModel:
    """Tokenizes `QUERY` with the Hugging Face tokenizer of `tokenizer_dir`."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        tokenizer_dir = params.parameter(config, "tokenizer_dir")
        if tokenizer_dir is None:
            raise pb_utils.TritonModelException("preprocessing: parameter tokenizer_dir is not set")
        self.add_special_tokens = params.flag(
            params.parameter(config, "add_special_tokens"),
            default=True,
            name="add_special_tokens",
        )
        self.tokenizer = tk.load_tokenizer(tokenizer_dir)
        self.end_id, self.pad_id = tk.special_ids(self.tokenizer)
        self.vision = None
        vision_dir = params.parameter(config, "multimodal_model_path")
        if vision_dir is not None:
            from deploy.triton.vision.preprocess import VisionPreprocessor

            self.vision = VisionPreprocessor(vision_dir)
        logger.info("preprocessing ready: tokenizer %s", tokenizer_dir)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                outputs = self._outputs(request)
                wanted = set(request.requested_output_names())
                tensors = [pb_utils.Tensor(k, v) for k, v in outputs.items() if k in wanted]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except Exception as exc:
                logger.exception("preprocessing failed")
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(f"preprocessing: {exc}")
                    )
                )
        return responses

    def _outputs(self, request: Any) -> dict[str, npt.NDArray[Any]]:
        query = _input(request, "QUERY")
        if query is None:
            raise ValueError("QUERY is required")
        batch = query.shape[0]
        outputs: dict[str, npt.NDArray[Any]] = {}
        if self.vision is None:
            if any(_input(request, name) is not None for name in IMAGE_INPUTS):
                raise ValueError("this model takes no images (no multimodal_model_path)")
            input_ids, input_lengths = self._encode(query)
        else:
            images = self.vision.images(
                _input(request, "IMAGE_URL"), _input(request, "IMAGE_BYTES"), batch
            )
            input_ids, input_lengths = self.vision.encode(
                self.tokenizer,
                query,
                images,
                add_special_tokens=self.add_special_tokens,
                pad_id=self.pad_id,
            )
            outputs["PIXEL_VALUES"] = self.vision.pixel_values(images)
        outputs |= {
            "INPUT_ID": input_ids,
            "REQUEST_INPUT_LEN": input_lengths,
            "BAD_WORDS_IDS": tk.word_lists(
                self.tokenizer, _input(request, "BAD_WORDS_DICT"), batch
            ),
            "STOP_WORDS_IDS": tk.word_lists(
                self.tokenizer, _input(request, "STOP_WORDS_DICT"), batch
            ),
            "EMBEDDING_BIAS": tk.embedding_bias(
                self.tokenizer,
                _input(request, "EMBEDDING_BIAS_WORDS"),
                _input(request, "EMBEDDING_BIAS_WEIGHTS"),
                batch,
            ),
            "OUT_END_ID": _id_column(_input(request, "END_ID"), self.end_id, batch),
            "OUT_PAD_ID": _id_column(_input(request, "PAD_ID"), self.pad_id, batch),
        }
        output_len = _input(request, "REQUEST_OUTPUT_LEN")
        if output_len is not None:
            outputs["REQUEST_OUTPUT_LEN"] = output_len.astype(np.int32).reshape(batch, -1)
        decoder_query = _input(request, "DECODER_QUERY")
        if decoder_query is not None:
            decoder_ids, decoder_lengths = self._encode(decoder_query)
            outputs["DECODER_INPUT_ID"] = decoder_ids
            outputs["REQUEST_DECODER_INPUT_LEN"] = decoder_lengths
        extra_id = _input(request, "PROMPT_TABLE_EXTRA_ID")
        if extra_id is not None:
            outputs["OUT_PROMPT_TABLE_EXTRA_IDS"] = tk.prompt_table_extra_ids(
                input_ids, extra_id, len(self.tokenizer)
            )
        return outputs

    def _encode(self, texts: npt.NDArray[Any]) -> tuple[tk.IntArray, tk.IntArray]:
        return tk.encode_queries(
            self.tokenizer, texts, add_special_tokens=self.add_special_tokens, pad_id=self.pad_id
        )

    def finalize(self) -> None:
        logger.info("preprocessing unloaded")


def _input(request: Any, name: str) -> npt.NDArray[Any] | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _id_column(given: npt.NDArray[Any] | None, default: int, batch: int) -> tk.IntArray:
    if given is None:
        return np.full((batch, 1), default, dtype=np.int32)
    return given.astype(np.int32).reshape(batch, -1)
