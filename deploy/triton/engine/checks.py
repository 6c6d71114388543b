"""A request checked against the model and the engine's limits, before anything runs (torch-free,
so every engine behind the Triton model checks the same way)."""

from __future__ import annotations

from deploy.triton.engine.types import EngineError, EngineRequest


def _check_ids(name: str, ids: tuple[int, ...], vocab_size: int) -> None:
    if any(not 0 <= token < vocab_size for token in ids):
        raise EngineError(f"{name} holds token ids outside the vocabulary [0, {vocab_size})")


def _check_prompt_ids(request: EngineRequest, vocab_size: int) -> None:
    """Prompt ids are vocabulary ids, or ids ``vocab_size + r`` of the prompt table's rows."""
    table = request.prompt_table
    rows = 0 if table is None else int(table.shape[0])
    if table is not None and table.ndim != 2:
        raise EngineError(f"prompt_embedding_table must be [rows, hidden], got {table.shape}")
    if any(not 0 <= token < vocab_size + rows for token in request.input_ids):
        if rows:
            raise EngineError(
                f"input_ids holds token ids outside [0, {vocab_size + rows}): the vocabulary "
                f"[0, {vocab_size}) and the {rows} rows of prompt_embedding_table"
            )
        raise EngineError(f"input_ids holds token ids outside the vocabulary [0, {vocab_size})")


def _check_sampling(request: EngineRequest) -> None:
    params = request.sampling
    if params.temperature < 0:
        raise EngineError("temperature must not be negative")
    if params.top_k < 0:
        raise EngineError("runtime_top_k must not be negative")
    if params.top_p > 1:
        raise EngineError("runtime_top_p must not exceed 1")
    if params.repetition_penalty <= 0:
        raise EngineError("repetition_penalty must be positive")
    if params.min_tokens < 0:
        raise EngineError("min_tokens must not be negative")


def _check_beams(request: EngineRequest, max_beam_width: int, max_batch_size: int) -> None:
    """Beam search as far as the engine takes it: within ``max_beam_width`` and the batch, one
    response of every beam, no grammar and no per-token logits."""
    beam = request.beam
    if beam is None:
        return
    if not 1 <= beam.width <= max_beam_width:
        raise EngineError(
            f"beam_width {beam.width} is outside [1, max_beam_width {max_beam_width}] of the model"
        )
    if beam.width > max_batch_size:
        raise EngineError(
            f"beam_width {beam.width} exceeds torch_max_batch_size ({max_batch_size}): every "
            "beam takes a row of the batch"
        )
    unsupported = {
        "num_return_sequences > 1": request.num_return_sequences > 1,
        "guided decoding": request.guide is not None,
        "return_generation_logits": request.return_generation_logits,
    }
    for feature, asked in unsupported.items():
        if asked:
            raise EngineError(f"{feature} with beam_width > 1 is not supported by the torch engine")


def validate_request(
    request: EngineRequest,
    vocab_size: int,
    max_seq_len: int | None,
    max_batch_size: int,
    max_beam_width: int = 1,
) -> int:
    """Check a request against the model and limits; returns its effective max new tokens."""
    prompt = len(request.input_ids)
    if prompt == 0:
        raise EngineError("input_ids is empty")
    if request.max_new_tokens < 1:
        raise EngineError("request_output_len must be at least 1")
    if not 1 <= request.num_return_sequences <= max_batch_size:
        raise EngineError(
            f"num_return_sequences must be between 1 and torch_max_batch_size ({max_batch_size})"
        )
    if max_seq_len is not None and prompt >= max_seq_len:
        raise EngineError(
            f"the prompt has {prompt} tokens but torch_max_seq_len is {max_seq_len}: "
            "no room is left for output"
        )
    _check_prompt_ids(request, vocab_size)
    for word in request.stop_words:
        _check_ids("stop_words_list", word, vocab_size)
    for word in request.bad_words:
        _check_ids("bad_words_list", word, vocab_size)
    bias = request.embedding_bias
    if bias is not None and bias.size not in (0, vocab_size):
        raise EngineError(f"embedding_bias has {bias.size} values; the vocabulary has {vocab_size}")
    _check_sampling(request)
    _check_beams(request, max_beam_width, max_batch_size)
    if max_seq_len is None:
        return request.max_new_tokens
    return min(request.max_new_tokens, max_seq_len - prompt)
