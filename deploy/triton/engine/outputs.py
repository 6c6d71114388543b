"""Output tensors of the `tensorrt_llm` model's responses, shaped as the C++ backend shapes them.

What a response carries depends on the request's flags and on the release whose config is
deployed: releases before v0.14 (their configs declare no `sequence_index`) answered outputs a
request did not ask for with zero placeholders, and the stock v0.8 postprocessing reads them
unconditionally; later releases leave those outputs out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from deploy.triton.engine.types import Beams, RequestBlocks, SequenceOutput

Array = npt.NDArray[Any]
Builder = Callable[[], Array]
_NUMPY_TYPES: dict[str, type[np.generic]] = {
    "TYPE_FP32": np.float32,
    "TYPE_FP16": np.float16,
    "TYPE_FP64": np.float64,
}


@dataclass(frozen=True)
class OutputLayout:
    """What the deployed config says about outputs: the logits dtype and the release's habits."""

    logits_dtype: type[np.generic] = np.float32
    placeholders: bool = False
    """Answer unrequested log-prob and logits outputs with zeros (releases before v0.14)."""

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any]) -> OutputLayout:
        """Read the `context_logits` dtype and whether the config predates `sequence_index`."""
        outputs = {str(o.get("name")): o for o in model_config.get("output", ())}
        declared = str(outputs.get("context_logits", {}).get("data_type", "TYPE_FP32"))
        return cls(
            logits_dtype=_NUMPY_TYPES.get(declared, np.float32),
            placeholders="sequence_index" not in outputs,
        )


@dataclass(frozen=True)
class ItemContext:
    """What shapes the responses of one batch item of a Triton request."""

    batch_index: int
    batch_size: int
    prompt: npt.NDArray[np.int32]
    streaming: bool
    exclude_input: bool
    return_log_probs: bool
    return_num_input_tokens: bool
    return_num_output_tokens: bool
    num_return_sequences: int = 1
    return_context_logits: bool = False
    return_generation_logits: bool = False
    return_perf_metrics: bool = False
    max_new_tokens: int = 0
    """Effective output budget: TensorRT-LLM sizes generation logits by it."""
    vocab_size: int = 0
    beam_width: int = 1


def _cell(value: float, dtype: type[np.generic]) -> Array:
    return np.array([[value]], dtype=dtype)


@functools.lru_cache(maxsize=4096)
def _count(value: int) -> Array:
    """A ``[1, 1]`` INT32 count, made once per value and shared read-only: a streamed response
    carries two to four of them, and making each anew cost the engine thread about half a
    microsecond."""
    cell = np.array([[value]], dtype=np.int32)
    cell.flags.writeable = False
    return cell


def _output_ids(output: SequenceOutput, context: ItemContext) -> Array:
    ids = output.token_ids.astype(np.int32)
    if not context.streaming and not context.exclude_input:
        ids = np.concatenate([context.prompt, ids]).astype(np.int32)
    return ids


def _log_probs(
    output: SequenceOutput, context: ItemContext, layout: OutputLayout
) -> dict[str, Builder]:
    """Every log prob generated so far (streamed responses too, as the executor sends them)."""
    log_probs = output.log_probs
    if context.return_log_probs and log_probs is not None:
        return {
            "cum_log_probs": lambda: _cell(output.cum_log_prob, np.float32),
            "output_log_probs": lambda: log_probs.astype(np.float32).reshape(1, 1, -1),
        }
    if not layout.placeholders:
        return {}
    return {
        "cum_log_probs": lambda: np.zeros((1, 1), np.float32),
        "output_log_probs": lambda: np.zeros((1, 1, context.prompt.size), np.float32),
    }


def _generation_logits(output: SequenceOutput, context: ItemContext, layout: OutputLayout) -> Array:
    """`[1, 1, max_new_tokens, vocab]` (zero-padded), or `[1, new, 1, vocab]` per streamed chunk
    in releases since v0.14."""
    rows = np.asarray(output.generation_logits).reshape(-1, context.vocab_size)
    if context.streaming and not layout.placeholders:
        new = rows[output.new_from :]
        return new.reshape(1, new.shape[0], 1, context.vocab_size).astype(layout.logits_dtype)
    width = max(context.max_new_tokens, rows.shape[0])
    padded = np.zeros((1, 1, width, context.vocab_size), layout.logits_dtype)
    padded[0, 0, : rows.shape[0]] = rows
    return padded


def _logits(
    output: SequenceOutput, context: ItemContext, layout: OutputLayout
) -> dict[str, Builder]:
    dtype = layout.logits_dtype
    tensors: dict[str, Builder] = {}
    if context.return_context_logits and output.context_logits is not None:
        context_logits = output.context_logits
        tensors["context_logits"] = lambda: context_logits.astype(dtype)[np.newaxis]
    elif layout.placeholders:
        tensors["context_logits"] = lambda: np.zeros((1, 1, 1), dtype)
    if context.return_generation_logits and output.generation_logits is not None:
        tensors["generation_logits"] = lambda: _generation_logits(output, context, layout)
    elif layout.placeholders:
        tensors["generation_logits"] = lambda: np.zeros((1, 1, 1, 1), dtype)
    return tensors


def _perf_metrics(output: SequenceOutput) -> dict[str, Builder]:
    """TensorRT-LLM's per-request perf metrics: the prompt's KV-cache blocks (found cached,
    taken from the pool, of which held no cached content) and timings; no draft tokens."""
    timings = output.timings
    if timings is None:
        return {}
    blocks = output.blocks or RequestBlocks()
    values: dict[str, tuple[float, type[np.generic]]] = {
        "kv_cache_alloc_new_blocks": (blocks.alloc_new, np.int32),
        "kv_cache_reused_blocks": (blocks.reused, np.int32),
        "kv_cache_alloc_total_blocks": (blocks.alloc_total, np.int32),
        "arrival_time_ns": (timings.arrival_ns, np.int64),
        "first_scheduled_time_ns": (timings.first_scheduled_ns, np.int64),
        "first_token_time_ns": (timings.first_token_ns, np.int64),
        "last_token_time_ns": (timings.last_token_ns, np.int64),
        "acceptance_rate": (0.0, np.float32),
        "total_accepted_draft_tokens": (0, np.int32),
        "total_draft_tokens": (0, np.int32),
    }
    return {name: functools.partial(_cell, value, dtype) for name, (value, dtype) in values.items()}


def _transfer_metrics(output: SequenceOutput) -> dict[str, Builder]:
    """A generation-only request's KV-cache handoff: its time, blocks and bytes (TensorRT-LLM's
    ``kvCacheTransfer`` timing and ``kvCacheSize``)."""
    transfer = output.kv_transfer
    if transfer is None:
        return {}
    return {
        "kv_cache_transfer_ms": functools.partial(_cell, transfer.ms, np.float32),
        "kv_cache_transfer_blocks": functools.partial(_cell, transfer.blocks, np.int32),
        "kv_cache_size": functools.partial(_cell, transfer.bytes, np.int64),
    }


def _padded(rows: list[Array], dtype: type[np.generic], fill: float) -> Array:
    """Rows of different lengths as ``[1, rows, longest]``, padded with ``fill``."""
    width = max((row.size for row in rows), default=0)
    table = np.full((1, len(rows), width), fill, dtype)
    for index, row in enumerate(rows):
        table[0, index, : row.size] = row
    return table


def _beam_tensors(beams: Beams, context: ItemContext) -> dict[str, Builder]:
    """Every beam in one response, as the C++ backend answers a beam search: ``output_ids``
    ``[1, beams, tokens]`` padded with -1, ``sequence_length`` and ``cum_log_probs``
    ``[1, beams]``, ``output_log_probs`` ``[1, beams, tokens]``. Streamed responses carry each
    beam's tokens so far (beams change from step to step), never the prompt."""
    ids = [beam.astype(np.int32) for beam in beams.token_ids]
    if not context.streaming and not context.exclude_input:
        ids = [np.concatenate([context.prompt, beam]).astype(np.int32) for beam in ids]
    builders: dict[str, Builder] = {
        "output_ids": lambda: _padded(ids, np.int32, -1),
        "sequence_length": lambda: np.array([[row.size for row in ids]], np.int32),
    }
    if context.return_log_probs:
        builders["cum_log_probs"] = lambda: np.array([beams.cum_log_probs], np.float32)
        builders["output_log_probs"] = lambda: _padded(list(beams.log_probs), np.float32, 0.0)
    if context.return_num_output_tokens:
        builders["num_output_tokens"] = lambda: _count(sum(row.size for row in ids))
    return builders


def response_tensors(
    output: SequenceOutput,
    context: ItemContext,
    requested: Collection[str],
    layout: OutputLayout = OutputLayout(),
) -> dict[str, Array]:
    """The output tensors of one response, limited to the `requested` names.

    Streaming responses carry only new tokens; a non-streaming response carries the prompt too
    unless `exclude_input_in_output`. `batch_index` comes only with a batch of several items and
    `sequence_index` only with several return sequences, as from the C++ backend.
    """
    ids = _output_ids(output, context)
    builders: dict[str, Builder] = {
        "output_ids": lambda: ids.reshape(1, 1, -1),
        "sequence_length": lambda: _count(ids.size),
        **_log_probs(output, context, layout),
        **_logits(output, context, layout),
    }
    if context.batch_size > 1:
        builders["batch_index"] = lambda: _count(context.batch_index)
    if context.num_return_sequences > 1:
        builders["sequence_index"] = lambda: _count(output.sequence_index)
    if context.return_perf_metrics and (output.new_from == 0 or output.finished):
        # On a request's first and last responses: their values are known from the first token
        # on (but the last token's time), and ten more tensors on every streamed token halve the
        # engine's throughput at 64 streams through an ensemble.
        builders.update(_perf_metrics(output))
        builders.update(_transfer_metrics(output))
    params = output.context_phase_params
    if params is not None:
        builders["context_phase_params"] = lambda: np.frombuffer(params, np.uint8).reshape(1, -1)
    if context.return_num_input_tokens:
        builders["num_input_tokens"] = lambda: _count(context.prompt.size)
    if context.return_num_output_tokens:
        builders["num_output_tokens"] = lambda: _count(ids.size)
    if output.beams is not None:
        builders.update(_beam_tensors(output.beams, context))
    return {name: build() for name, build in builders.items() if name in requested}
