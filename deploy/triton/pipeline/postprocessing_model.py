"""The `postprocessing` Triton model: token ids to text, incrementally per streaming request id."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import triton_python_backend_utils as pb_utils

from deploy.triton import params
from deploy.triton.pipeline import tokenization as tk
from deploy.triton.pipeline.detokenizer import DetokenizerCache

logger = logging.getLogger(__name__)


class TritonPythonModel:
    """Decodes `TOKENS_BATCH` `[B, beams, L]` cut to `SEQUENCE_LENGTH` into `OUTPUT` `[B, beams]`.

    A request with an id (the ensemble gives every step the client's request id) is treated as
    the next chunk of that id's stream: the output is the exact text delta, leading spaces and
    multi-byte characters included. Without an id each request is decoded on its own. The state
    lives in this single instance, bounded by `detokenizer_cache_size` and `detokenizer_ttl_s`.
    """

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        tokenizer_dir = params.parameter(config, "tokenizer_dir")
        if tokenizer_dir is None:
            raise pb_utils.TritonModelException(
                "postprocessing: parameter tokenizer_dir is not set"
            )
        self.skip_special_tokens = params.flag(
            params.parameter(config, "skip_special_tokens"),
            default=True,
            name="skip_special_tokens",
        )
        self.tokenizer = tk.load_tokenizer(tokenizer_dir)
        self.streams = DetokenizerCache(
            max_entries=int(params.parameter(config, "detokenizer_cache_size") or 4096),
            ttl_s=float(params.parameter(config, "detokenizer_ttl_s") or 120),
        )
        logger.info("postprocessing ready: tokenizer %s", tokenizer_dir)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                texts = self._texts(request)
                tensors = [pb_utils.Tensor("OUTPUT", tk.text_tensor(texts)), *_passed(request)]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except Exception as exc:
                logger.exception("postprocessing failed")
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(f"postprocessing: {exc}")
                    )
                )
        return responses

    def _texts(self, request: Any) -> list[list[str]]:
        tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
        sequences = tk.sequence_ids(tokens, lengths)
        request_id = request.request_id()
        if not request_id:
            return [[self._decode(ids) for ids in beams] for beams in sequences]
        return [
            [
                self.streams.get((request_id, b, k)).step(ids, self._decode)
                for k, ids in enumerate(beams)
            ]
            for b, beams in enumerate(sequences)
        ]

    def _decode(self, ids: Sequence[int]) -> str:
        return tk.decode(self.tokenizer, ids, skip_special_tokens=self.skip_special_tokens)

    def finalize(self) -> None:
        logger.info("postprocessing unloaded")


# Releases up to v0.11 route log probs and logits through postprocessing, unchanged.
PASSED_THROUGH = {
    "OUT_CUM_LOG_PROBS": "CUM_LOG_PROBS",
    "OUT_OUTPUT_LOG_PROBS": "OUTPUT_LOG_PROBS",
    "OUT_CONTEXT_LOGITS": "CONTEXT_LOGITS",
    "OUT_GENERATION_LOGITS": "GENERATION_LOGITS",
}


def _passed(request: Any) -> list[Any]:
    wanted = set(request.requested_output_names())
    tensors = []
    for output, source in PASSED_THROUGH.items():
        tensor = pb_utils.get_input_tensor_by_name(request, source)
        if output in wanted and tensor is not None:
            tensors.append(pb_utils.Tensor(output, tensor.as_numpy()))
    return tensors
