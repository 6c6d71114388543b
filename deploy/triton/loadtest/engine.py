"""A ZERO-COMPUTE load-test stand-in for the ``tensorrt_llm`` model: for benchmarks only.

It runs no model. Every request is answered inside ``execute`` with made-up tokens, so its text
is meaningless; what a benchmark then measures is the serving overhead alone (the gateway,
Triton, the pre- and postprocessing and the BLS). The tokens are the ``loadtest_token_id``
parameter when set, otherwise the request's own ``input_ids`` in a cycle (real words once
detokenized), never ``end_id``: a request always gets exactly ``request_output_len`` tokens.

The responses follow the ``tensorrt_llm`` tensor contract as the project's torch engine
(``deploy.triton.engine.triton_model``) answers it: one response per token when streaming (the last
one carries the final flag), one response per sequence otherwise, the prompt ahead of the output
unless ``exclude_input_in_output``, zero log probs, token counts, ``batch_index`` and
``sequence_index``, and an empty final response to a stop request. Sampling inputs, stop and bad
words, LoRA and guided decoding are accepted and ignored. Only numpy is used, never torch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import triton_python_backend_utils as pb_utils

from deploy.triton.params import flag, parameter

logger = logging.getLogger(__name__)

Array = npt.NDArray[Any]
Inputs = Mapping[str, Array]
NO_STOP_ID = "Trying to stop a request but request ID is not provided"
STREAMING_NEEDS_DECOUPLED = "Streaming is only supported if model is deployed using decoupled mode."
BATCH_NEEDS_DECOUPLED = (
    "Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy"
)
SEQUENCES_NEED_DECOUPLED = (
    "num_return_sequences > 1 requires the tensorrt_llm backend to be using decoupled "
    "transaction policy: each sequence is a response of its own"
)
NO_LOGITS = (
    "the load-test model computes no logits (return_context_logits, return_generation_logits)"
)
READ_INPUTS = frozenset(
    {
        "input_ids",
        "input_lengths",
        "request_output_len",
        "num_return_sequences",
        "streaming",
        "stop",
        "exclude_input_in_output",
        "end_id",
        "pad_id",
        "return_log_probs",
        "return_context_logits",
        "return_generation_logits",
        "return_num_input_tokens",
        "return_num_output_tokens",
    }
)


class LoadTestError(ValueError):
    """A request the load-test model refuses, with the message the client gets."""


@dataclass(frozen=True)
class Item:
    """One batch item of a request, as the load-test model reads it."""

    prompt: npt.NDArray[np.int32]
    output_len: int
    streaming: bool = False
    exclude_input: bool = False
    end_id: int | None = None
    pad_id: int | None = None
    num_return_sequences: int = 1
    return_log_probs: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    batch_index: int = 0
    batch_size: int = 1


def _rows(inputs: Inputs, name: str) -> Array | None:
    array = inputs.get(name)
    if array is None or array.size == 0:
        return None
    return np.asarray(array).reshape(array.shape[0] if array.ndim > 1 else 1, -1)


def _scalar(inputs: Inputs, name: str, item: int) -> Any | None:
    rows = _rows(inputs, name)
    if rows is None or rows.shape[1] == 0:
        return None
    return rows[min(item, rows.shape[0] - 1), 0].item()


def _int(inputs: Inputs, name: str, item: int) -> int | None:
    value = _scalar(inputs, name, item)
    return None if value is None else int(value)


def _flag(inputs: Inputs, name: str, item: int, default: bool = False) -> bool:
    value = _scalar(inputs, name, item)
    return default if value is None else bool(value)


def is_stop_request(inputs: Inputs) -> bool:
    """Whether this is a stop request (``stop`` true) for a running request of the same id."""
    return _flag(inputs, "stop", 0)


def read_items(inputs: Inputs, *, exclude_input_default: bool = False) -> list[Item]:
    """The batch items of a request, checked as the torch engine checks them."""
    rows = _rows(inputs, "input_ids")
    if rows is None:
        raise LoadTestError("input_ids is empty")
    items = []
    for index in range(rows.shape[0]):
        prompt = rows[index].astype(np.int32)
        length = _int(inputs, "input_lengths", index)
        if length is not None:
            if not 0 <= length <= prompt.size:
                raise LoadTestError(
                    f"input_lengths {length} does not fit input_ids of length {prompt.size}"
                )
            prompt = prompt[:length]
        if prompt.size == 0:
            raise LoadTestError("input_ids is empty")
        output_len = _int(inputs, "request_output_len", index)
        if output_len is None:
            raise LoadTestError("request_output_len is required")
        if output_len < 1:
            raise LoadTestError("request_output_len must be at least 1")
        sequences = _int(inputs, "num_return_sequences", index) or 1
        if sequences < 1:
            raise LoadTestError("num_return_sequences must be at least 1")
        if _flag(inputs, "return_context_logits", index) or _flag(
            inputs, "return_generation_logits", index
        ):
            raise LoadTestError(NO_LOGITS)
        items.append(
            Item(
                prompt=prompt,
                output_len=output_len,
                streaming=_flag(inputs, "streaming", index),
                exclude_input=_flag(
                    inputs, "exclude_input_in_output", index, exclude_input_default
                ),
                end_id=_int(inputs, "end_id", index),
                pad_id=_int(inputs, "pad_id", index),
                num_return_sequences=sequences,
                return_log_probs=_flag(inputs, "return_log_probs", index),
                return_num_input_tokens=_flag(inputs, "return_num_input_tokens", index),
                return_num_output_tokens=_flag(inputs, "return_num_output_tokens", index),
                batch_index=index,
                batch_size=rows.shape[0],
            )
        )
    return items


def check_policy(items: list[Item], *, decoupled: bool) -> None:
    """Refuse what only a decoupled model can do, with the C++ backend's words."""
    if decoupled:
        return
    if any(item.streaming for item in items):
        raise LoadTestError(STREAMING_NEEDS_DECOUPLED)
    if len(items) > 1:
        raise LoadTestError(BATCH_NEEDS_DECOUPLED)
    if any(item.num_return_sequences > 1 for item in items):
        raise LoadTestError(SEQUENCES_NEED_DECOUPLED)


def fake_tokens(
    prompt: Array,
    count: int,
    *,
    token_id: int | None = None,
    end_id: int | None = None,
    pad_id: int | None = None,
) -> npt.NDArray[np.int32]:
    """``count`` made-up token ids: ``token_id`` throughout, or else the prompt's ids in a cycle
    (``end_id`` and ``pad_id`` left out; the first id that is neither if nothing is left)."""
    if token_id is not None and token_id != end_id:
        return np.full(count, token_id, np.int32)
    pool = np.asarray(prompt, np.int32).reshape(-1)
    banned = [t for t in (end_id, pad_id) if t is not None]
    if banned:
        pool = pool[~np.isin(pool, banned)]
    if pool.size == 0:
        pool = np.array([next(t for t in range(3) if t not in banned)], np.int32)
    return np.resize(pool, count)


def _cell(value: float, dtype: type[np.generic]) -> Array:
    return np.array([[value]], dtype=dtype)


def response_outputs(
    item: Item,
    tokens: npt.NDArray[np.int32],
    generated: int,
    requested: Collection[str],
    *,
    sequence_index: int = 0,
    placeholders: bool = False,
) -> dict[str, Array]:
    """The outputs of one response holding ``tokens`` after ``generated`` tokens in all so far,
    limited to ``requested``, shaped as ``deploy.triton.engine.outputs`` shapes the torch engine's.

    ``placeholders``: answer unrequested log probs and logits with zeros (configs before v0.14).
    """
    ids = tokens
    if not item.streaming and not item.exclude_input:
        ids = np.concatenate([item.prompt, tokens]).astype(np.int32)
    out: dict[str, Array] = {
        "output_ids": ids.reshape(1, 1, -1),
        "sequence_length": _cell(ids.size, np.int32),
    }
    if item.return_log_probs:
        out["cum_log_probs"] = np.zeros((1, 1), np.float32)
        out["output_log_probs"] = np.zeros((1, 1, generated), np.float32)
    elif placeholders:
        out["cum_log_probs"] = np.zeros((1, 1), np.float32)
        out["output_log_probs"] = np.zeros((1, 1, item.prompt.size), np.float32)
    if placeholders:
        out["context_logits"] = np.zeros((1, 1, 1), np.float32)
        out["generation_logits"] = np.zeros((1, 1, 1, 1), np.float32)
    if item.batch_size > 1:
        out["batch_index"] = _cell(item.batch_index, np.int32)
    if item.num_return_sequences > 1:
        out["sequence_index"] = _cell(sequence_index, np.int32)
    if item.return_num_input_tokens:
        out["num_input_tokens"] = _cell(item.prompt.size, np.int32)
    if item.return_num_output_tokens:
        out["num_output_tokens"] = _cell(ids.size, np.int32)
    return {name: value for name, value in out.items() if name in requested}


def item_outputs(
    item: Item,
    requested: Collection[str],
    *,
    token_id: int | None = None,
    placeholders: bool = False,
) -> list[dict[str, Array]]:
    """Every response of one item: a token each when streaming, else one per sequence."""
    tokens = fake_tokens(
        item.prompt, item.output_len, token_id=token_id, end_id=item.end_id, pad_id=item.pad_id
    )
    responses: list[dict[str, Array]] = []
    for sequence in range(item.num_return_sequences):
        chunks = (
            [(tokens[i : i + 1], i + 1) for i in range(tokens.size)]
            if item.streaming
            else [(tokens, tokens.size)]
        )
        responses.extend(
            response_outputs(
                item,
                chunk,
                generated,
                requested,
                sequence_index=sequence,
                placeholders=placeholders,
            )
            for chunk, generated in chunks
        )
    return responses


# Tensors cross the stub boundary as numpy arrays (DLPack from numpy corrupts the 2.51 stub).
# The 2.51 stub's numpy conversion needs numpy < 2: on machines whose engine environment has
# numpy 2 the spec's `text_python_env` (which this model then runs in) provides it.
def _as_array(tensor: Any) -> Array:
    return np.asarray(tensor.as_numpy())


def _tensor(name: str, value: Array) -> Any:
    return pb_utils.Tensor(name, np.ascontiguousarray(value))


def _error(message: str) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


class TritonPythonModel:
    """The load-test ``tensorrt_llm`` model: zero compute, meaningless text, benchmarks only."""

    def initialize(self, args: dict[str, str]) -> None:
        """Read the transaction policy and the parameters of the config."""
        model_config = json.loads(args["model_config"])
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self._exclude_input = flag(
            parameter(model_config, "exclude_input_in_output"),
            default=False,
            name="exclude_input_in_output",
        )
        token = parameter(model_config, "loadtest_token_id")
        self._token_id = None if token is None else int(token)
        outputs = {str(o.get("name")) for o in model_config.get("output", ())}
        self._placeholders = "sequence_index" not in outputs
        logger.warning(
            "%s is the ZERO-COMPUTE load-test model: its text is meaningless (benchmarks only)",
            args.get("model_name", "tensorrt_llm"),
        )

    def execute(self, requests: list[Any]) -> list[Any] | None:
        """Answer every request at once: through its sender when decoupled, else returned."""
        if not self._decoupled:
            return [self._responses(request)[-1] for request in requests]
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            sender = request.get_response_sender()
            responses = self._responses(request)
            for response in responses[:-1]:
                sender.send(response)
            sender.send(responses[-1], flags=final)
        return None

    def finalize(self) -> None:
        """Nothing runs between calls, so nothing is left to stop."""

    def _responses(self, request: Any) -> list[Any]:
        try:
            inputs = {
                tensor.name(): _as_array(tensor)
                for tensor in request.inputs()
                if tensor.name() in READ_INPUTS
            }
            if is_stop_request(inputs):
                # Every request is over when execute returns: as the torch engine does for an
                # id it does not know, answer with an empty final response.
                if not request.request_id():
                    return [_error(NO_STOP_ID)]
                return [pb_utils.InferenceResponse(output_tensors=[])]
            items = read_items(inputs, exclude_input_default=self._exclude_input)
            check_policy(items, decoupled=self._decoupled)
            requested = frozenset(request.requested_output_names())
            return [
                pb_utils.InferenceResponse(
                    output_tensors=[_tensor(name, value) for name, value in outputs.items()]
                )
                for item in items
                for outputs in item_outputs(
                    item, requested, token_id=self._token_id, placeholders=self._placeholders
                )
            ]
        except LoadTestError as exc:
            return [_error(str(exc))]
        except Exception as exc:
            logger.exception("load-test model could not answer request %r", request.request_id())
            return [_error(f"invalid request: {exc}")]
