"""Translation of the `tensorrt_llm` model's Triton input tensors into engine requests."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from deploy.triton.engine.disagg.phase import (
    BadContextPhase,
    ContextPhaseParams,
    RequestType,
    refusal,
)
from deploy.triton.engine.outputs import ItemContext
from deploy.triton.engine.types import (
    EngineBeamSearch,
    EngineError,
    EngineRequest,
    GuideRequest,
    LoraRequest,
    SamplingConfig,
    TokenIds,
    WordList,
)

logger = logging.getLogger(__name__)

Inputs = Mapping[str, npt.NDArray[Any]]
T = TypeVar("T")

_UNSUPPORTED_INPUTS = {
    "encoder_input_features": "encoder-decoder models",
    "draft_input_ids": "speculative decoding",
    "draft_logits": "speculative decoding",
    "cross_attention_mask": "multimodal models",
    "mrope_rotary_cos_sin": "multimodal models",
}
_LOOKAHEAD_INPUTS = (
    "lookahead_window_size",
    "lookahead_ngram_size",
    "lookahead_verification_set_size",
)
LOOKAHEAD_ERROR = (
    "The request lookahead decoding input tensors (window_size, ngram_size and "
    "verification_set_size) can only be set if the model instance lookahead parameters are "
    "also specified"
)


def _present(array: npt.NDArray[Any] | None) -> bool:
    if array is None or array.size == 0:
        return False
    if array.dtype == object:
        return any(bool(value) for value in array.flat)
    return True


def _row(inputs: Inputs, name: str, item: int) -> npt.NDArray[Any] | None:
    array = inputs.get(name)
    if array is None or array.size == 0:
        return None
    rows: npt.NDArray[Any] = np.asarray(array).reshape(array.shape[0] if array.ndim else 1, -1)
    row: npt.NDArray[Any] = rows[min(item, rows.shape[0] - 1)]
    return row


def _scalar(
    inputs: Inputs, names: tuple[str, ...], item: int, cast: Callable[[Any], T]
) -> T | None:
    for name in names:
        row = _row(inputs, name, item)
        if row is not None and row.size:
            return cast(row[0].item())
    return None


def _flag(inputs: Inputs, name: str, item: int, default: bool = False) -> bool:
    value = _scalar(inputs, (name,), item, bool)
    return default if value is None else value


def parse_word_list(array: npt.NDArray[Any] | None) -> WordList:
    """Decode a [2, K] word list: row 0 flat token ids, row 1 end offsets padded with -1."""
    if array is None or array.size == 0:
        return ()
    table = np.asarray(array).reshape(2, -1)
    ids, offsets = table[0].tolist(), table[1].tolist()
    words: list[TokenIds] = []
    start = 0
    for end in offsets:
        if end < 0:
            break
        if not start <= end <= len(ids):
            raise EngineError("invalid word list: offsets must grow and stay within the ids")
        if end > start:
            words.append(tuple(int(t) for t in ids[start:end]))
        start = end
    return tuple(words)


def is_stop_request(inputs: Inputs) -> bool:
    """Whether this is a stop request (`stop` true) for a running request of the same id."""
    return _flag(inputs, "stop", 0)


def batch_size(inputs: Inputs) -> int:
    """The number of batch items in a request."""
    ids = inputs.get("input_ids")
    if ids is None:
        raise EngineError("input_ids is required")
    return int(ids.shape[0]) if ids.ndim > 1 else 1


def check_supported(inputs: Inputs) -> None:
    """Reject features the torch engine does not implement, instead of ignoring them."""
    for name, feature in _UNSUPPORTED_INPUTS.items():
        if _present(inputs.get(name)):
            raise EngineError(f"{feature} ({name}) is not supported by the torch engine")
    if any(_present(inputs.get(name)) for name in _LOOKAHEAD_INPUTS):
        raise EngineError(LOOKAHEAD_ERROR)
    for item in range(batch_size(inputs)):
        _check_decoder_input(inputs, item)


def _check_decoder_input(inputs: Inputs, item: int) -> None:
    """Decoder inputs of one token are the placeholder the stock preprocessing always sends
    (`[[pad_id]]`); like the C++ backend, a decoder-only model ignores them. A longer decoder
    prompt is real encoder-decoder input."""
    row = _row(inputs, "decoder_input_ids", item)
    if row is None:
        return
    length = _scalar(inputs, ("decoder_input_lengths",), item, int)
    tokens = row.size if length is None else min(length, row.size)
    if tokens > 1:
        raise EngineError(
            f"decoder_input_ids holds {tokens} tokens: encoder-decoder models are not "
            "supported by the torch engine, which serves decoder-only models"
        )


def _prompt(inputs: Inputs, item: int) -> npt.NDArray[np.int32]:
    ids = np.asarray(inputs["input_ids"])
    row: npt.NDArray[np.int32] = ids.reshape(ids.shape[0] if ids.ndim > 1 else 1, -1)[item]
    row = row.astype(np.int32)
    length = _scalar(inputs, ("input_lengths",), item, int)
    if length is None:
        return row
    if not 0 <= length <= row.size:
        raise EngineError(f"input_lengths {length} does not fit input_ids of length {row.size}")
    return row[:length]


def _sampling(inputs: Inputs, item: int) -> SamplingConfig:
    def get(names: tuple[str, ...], cast: Callable[[Any], T], default: T) -> T:
        value = _scalar(inputs, names, item, cast)
        return default if value is None else value

    top_p = get(("runtime_top_p",), float, 0.0)
    reset_id = _scalar(inputs, ("runtime_top_p_reset_ids",), item, int)
    return SamplingConfig(
        temperature=get(("temperature",), float, 1.0),
        top_k=get(("runtime_top_k",), int, 0),
        top_p=top_p if top_p > 0 else 0.0,
        repetition_penalty=get(("repetition_penalty",), float, 1.0),
        presence_penalty=get(("presence_penalty",), float, 0.0),
        frequency_penalty=get(("frequency_penalty",), float, 0.0),
        min_tokens=get(("min_tokens", "min_length"), int, 1),
        seed=get(("seed", "random_seed"), int, 0),
        top_p_decay=get(("runtime_top_p_decay",), float, 1.0),
        top_p_reset_id=reset_id if reset_id is not None and reset_id >= 0 else None,
    )


def _beam(inputs: Inputs, item: int) -> EngineBeamSearch | None:
    """Beam search for ``beam_width`` above 1 (TensorRT-LLM's defaults: no length penalty,
    early stopping, no diversity); ``early_stopping`` may be a bool or TensorRT-LLM's int."""
    width = _scalar(inputs, ("beam_width",), item, int)
    if width is None or width == 1:
        return None
    if width < 1:
        raise EngineError(f"beam_width must be at least 1, got {width}")
    early = _scalar(inputs, ("early_stopping",), item, int)
    return EngineBeamSearch(
        width=width,
        length_penalty=_scalar(inputs, ("len_penalty", "length_penalty"), item, float) or 0.0,
        early_stopping=1 if early is None else early,
        diversity_rate=_scalar(inputs, ("beam_search_diversity_rate",), item, float) or 0.0,
    )


def _end_ids(inputs: Inputs, item: int) -> TokenIds | None:
    end_id = _scalar(inputs, ("end_id",), item, int)
    if end_id is None:
        return None
    return (end_id,) if end_id >= 0 else ()


def _lora_tensor(inputs: Inputs, name: str, item: int) -> npt.NDArray[Any] | None:
    """One item's ``lora_weights`` or ``lora_config`` as ``[num_modules_layers, row]``."""
    array = inputs.get(name)
    if array is None or array.size == 0:
        return None
    if array.ndim == 3:
        if array.shape[0] != 1 and item >= array.shape[0]:
            raise EngineError(f"Expected batch dimension to be 1 for each lora request ({name})")
        return np.asarray(array[min(item, array.shape[0] - 1)])
    return np.asarray(array).reshape(-1, array.shape[-1])


def _lora(inputs: Inputs, item: int) -> LoraRequest | None:
    """The item's LoRA inputs, checked as the C++ backend checks them."""
    task_id = _scalar(inputs, ("lora_task_id",), item, int)
    weights = _lora_tensor(inputs, "lora_weights", item)
    config = _lora_tensor(inputs, "lora_config", item)
    if task_id is None:
        if weights is not None or config is not None:
            raise EngineError("lora_task_id must be set for LoRA inference")
        return None
    if (weights is None) != (config is None):
        raise EngineError("Request for LoRA inference must have both lora_weights and lora_keys")
    return LoraRequest(task_id, weights, config)


def _extra_ids(inputs: Inputs, item: int, prompt_length: int) -> TokenIds | None:
    """The item's ``prompt_table_extra_ids``, one per prompt token; all zero is none."""
    row = _row(inputs, "prompt_table_extra_ids", item)
    if row is None or not row.any():
        return None
    if row.size < prompt_length:
        raise EngineError(
            f"prompt_table_extra_ids holds {row.size} ids for a prompt of {prompt_length} tokens"
        )
    return tuple(int(value) for value in row[:prompt_length])


def _prompt_table(inputs: Inputs, item: int) -> npt.NDArray[Any] | None:
    """The item's ``prompt_embedding_table`` as ``[rows, hidden]``, cut to its
    ``prompt_vocab_size`` rows when that is given; None when absent or empty."""
    array = inputs.get("prompt_embedding_table")
    if array is None or array.size == 0:
        return None
    table = np.asarray(array)
    if table.ndim == 3:
        table = table[min(item, table.shape[0] - 1)]
    if table.ndim != 2:
        raise EngineError(f"prompt_embedding_table must be [rows, hidden], got {array.shape}")
    size = _scalar(inputs, ("prompt_vocab_size",), item, int)
    if size is not None:
        if not 0 <= size <= table.shape[0]:
            raise EngineError(
                f"prompt_vocab_size {size} exceeds the {table.shape[0]} rows of "
                "prompt_embedding_table"
            )
        table = table[:size]
    return table if table.size else None


def content_extra_ids(
    prompt: npt.NDArray[np.int32],
    table: npt.NDArray[Any],
    vocab_size: int,
    sent: TokenIds | None = None,
) -> TokenIds:
    """Extra ids keyed by content: each prompt-table id gets a 64-bit digest of the row it
    stands for and of the id the client ``sent`` for it (never 0), so equal images share KV
    blocks and different ones never do, whatever the client sent; every vocabulary id keeps the
    client's id (0 when none)."""
    rows = np.ascontiguousarray(table)
    ids = []
    for index, token in enumerate(prompt.tolist()):
        client = sent[index] if sent is not None else 0
        if token < vocab_size or token - vocab_size >= rows.shape[0]:
            ids.append(client)
            continue
        digest = hashlib.blake2b(rows[token - vocab_size].tobytes(), digest_size=8)
        if client:
            digest.update(int(client % 2**64).to_bytes(8, "little"))
        ids.append(int.from_bytes(digest.digest(), "little") or 1)
    return tuple(ids)


def _text(inputs: Inputs, name: str, item: int) -> str | None:
    row = _row(inputs, name, item)
    if row is None or not row.size:
        return None
    value = row[0]
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text or None


def _guide(inputs: Inputs, item: int) -> GuideRequest | None:
    """The item's guided-decoding inputs; a guide without a type is ignored, as in C++."""
    guide_type = _text(inputs, "guided_decoding_guide_type", item)
    if guide_type is None:
        return None
    return GuideRequest(guide_type, _text(inputs, "guided_decoding_guide", item))


def _context_phase(inputs: Inputs, item: int) -> ContextPhaseParams | None:
    row = _row(inputs, "context_phase_params", item)
    if row is None:
        return None
    try:
        return ContextPhaseParams.decode(row.astype(np.uint8).tobytes())
    except BadContextPhase as exc:
        raise EngineError(str(exc)) from exc


def _disaggregated(request: EngineRequest) -> EngineRequest:
    """The request, refused where its request type cannot be served with its inputs."""
    reason = refusal(
        request.request_type,
        has_params=request.context_phase is not None,
        streaming=request.streaming,
        rows=request.rows,
        context_logits=request.return_context_logits,
    )
    if reason is not None:
        raise EngineError(reason)
    return request


def parse_items(
    inputs: Inputs,
    *,
    id_prefix: str,
    exclude_input_default: bool,
    vocab_size: int = 0,
    request_type: object = None,
) -> list[tuple[EngineRequest, ItemContext]]:
    """Engine requests (ids `<id_prefix>/<item>`) and response contexts, one per batch item;
    ``request_type`` is the request's parameter of that name."""
    check_supported(inputs)
    try:
        kind = RequestType.parse(request_type)
    except BadContextPhase as exc:
        raise EngineError(str(exc)) from exc
    items = []
    size = batch_size(inputs)
    arrival = time.time_ns()
    for item in range(size):
        output_len = _scalar(inputs, ("request_output_len",), item, int)
        if output_len is None:
            raise EngineError("request_output_len is required")
        prompt = _prompt(inputs, item)
        bias = _row(inputs, "embedding_bias", item)
        table = _prompt_table(inputs, item)
        extra_ids = _extra_ids(inputs, item, prompt.size)
        if table is not None:
            extra_ids = content_extra_ids(prompt, table, vocab_size, extra_ids)
        request = EngineRequest(
            request_id=f"{id_prefix}/{item}",
            input_ids=tuple(int(t) for t in prompt),
            max_new_tokens=output_len,
            sampling=_sampling(inputs, item),
            end_ids=_end_ids(inputs, item),
            stop_words=parse_word_list(_row(inputs, "stop_words_list", item)),
            bad_words=parse_word_list(_row(inputs, "bad_words_list", item)),
            embedding_bias=None if bias is None else bias.astype(np.float32),
            streaming=_flag(inputs, "streaming", item),
            num_return_sequences=_scalar(inputs, ("num_return_sequences",), item, int) or 1,
            return_log_probs=_flag(inputs, "return_log_probs", item),
            return_context_logits=_flag(inputs, "return_context_logits", item),
            return_generation_logits=_flag(inputs, "return_generation_logits", item),
            arrival_ns=arrival,
            lora=_lora(inputs, item),
            guide=_guide(inputs, item),
            extra_ids=extra_ids,
            prompt_table=table,
            beam=_beam(inputs, item),
            cache_salt_id=_scalar(inputs, ("cache_salt_id",), item, int),
            request_type=kind,
            context_phase=_context_phase(inputs, item),
        )
        _disaggregated(request)
        perf = _flag(inputs, "return_perf_metrics", item) or _flag(
            inputs, "return_kv_cache_reuse_stats", item
        )
        context = ItemContext(
            batch_index=item,
            batch_size=size,
            prompt=prompt,
            streaming=request.streaming,
            exclude_input=_flag(inputs, "exclude_input_in_output", item, exclude_input_default),
            return_log_probs=request.return_log_probs,
            return_num_input_tokens=_flag(inputs, "return_num_input_tokens", item),
            return_num_output_tokens=_flag(inputs, "return_num_output_tokens", item),
            num_return_sequences=request.num_return_sequences,
            return_context_logits=request.return_context_logits,
            return_generation_logits=request.return_generation_logits,
            return_perf_metrics=perf,
            max_new_tokens=output_len,
            vocab_size=vocab_size,
            beam_width=request.beam.width if request.beam is not None else 1,
        )
        items.append((request, context))
    return items
