"""Tokenizer-side tensors of the preprocessing and postprocessing models, as pure functions."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from deploy.triton.pipeline.tokenizer_folder import (
    TextTokenizer,
    TransformersTokenizer,
    load_folder,
)

IntArray = npt.NDArray[np.int32]


def load_tokenizer(tokenizer_dir: str) -> TextTokenizer:
    """The Hugging Face tokenizer of a folder (rendering resolved built-in names), read without
    ``transformers`` where it has ``tokenizer.json``, or of a hub id."""
    folder = Path(tokenizer_dir)
    if folder.is_dir():
        return load_folder(folder)
    from transformers import AutoTokenizer

    return TransformersTokenizer(AutoTokenizer.from_pretrained(tokenizer_dir))


def special_ids(tokenizer: TextTokenizer) -> tuple[int, int]:
    """The default (end_id, pad_id): the eos token, and the pad token falling back to eos."""
    end_id = tokenizer.token_id(tokenizer.special_tokens.get("eos_token"))
    if end_id is None:
        raise ValueError("the tokenizer has no eos token: pass end_id with each request")
    pad_id = tokenizer.token_id(tokenizer.special_tokens.get("pad_token"))
    return end_id, end_id if pad_id is None else pad_id


def as_text(value: object) -> str:
    """A string tensor element (bytes or str) as text."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def encode_queries(
    tokenizer: TextTokenizer, queries: npt.NDArray[Any], *, add_special_tokens: bool, pad_id: int
) -> tuple[IntArray, IntArray]:
    """`[B, 1]` strings to right-padded ids `[B, L]` and lengths `[B, 1]`."""
    encoded = [
        tokenizer.encode(as_text(row.reshape(-1)[0]), add_special_tokens=add_special_tokens)
        for row in queries
    ]
    return right_padded(encoded, pad_id)


def right_padded(encoded: Sequence[Sequence[int]], pad_id: int) -> tuple[IntArray, IntArray]:
    """Id lists as right-padded ids `[B, L]` and their lengths `[B, 1]`."""
    longest = max((len(ids) for ids in encoded), default=0)
    ids = np.full((len(encoded), longest), pad_id, dtype=np.int32)
    for row, tokens in enumerate(encoded):
        ids[row, : len(tokens)] = tokens
    lengths = np.array([[len(tokens)] for tokens in encoded], dtype=np.int32).reshape(-1, 1)
    return ids, lengths


def word_lists(
    tokenizer: TextTokenizer, words: npt.NDArray[Any] | None, batch_size: int
) -> IntArray:
    """Stop or bad words `[B, K]` as TensorRT-LLM's `[B, 2, P]` flat ids + cumulative offsets.

    Each word is encoded on its own without special tokens; empty words are skipped. Row 0 holds
    the ids padded with 0, row 1 the end offsets padded with -1. No words at all gives `[B, 2, 0]`.
    """
    if words is None:
        return np.empty((batch_size, 2, 0), dtype=np.int32)
    flat: list[list[int]] = []
    offsets: list[list[int]] = []
    for row in words:
        ids: list[int] = []
        ends: list[int] = []
        for word in np.asarray(row).reshape(-1):
            tokens = tokenizer.encode(as_text(word), add_special_tokens=False)
            if tokens:
                ids.extend(tokens)
                ends.append(len(ids))
        flat.append(ids)
        offsets.append(ends)
    width = max(1, *(len(ids) for ids in flat))
    out = np.zeros((len(flat), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for row, (ids, ends) in enumerate(zip(flat, offsets, strict=True)):
        out[row, 0, : len(ids)] = ids
        out[row, 1, : len(ends)] = ends
    return out


def embedding_bias(
    tokenizer: TextTokenizer,
    words: npt.NDArray[Any] | None,
    weights: npt.NDArray[Any] | None,
    batch_size: int,
) -> npt.NDArray[np.float32]:
    """A `[B, V]` logit bias adding each word's weight to each of its tokens; `[B, 0]` if none."""
    if words is None or weights is None:
        return np.empty((batch_size, 0), dtype=np.float32)
    vocab_size = len(tokenizer)
    out = np.zeros((len(words), vocab_size), dtype=np.float32)
    for row, (row_words, row_weights) in enumerate(zip(words, weights, strict=True)):
        flat_words = np.asarray(row_words).reshape(-1)
        flat_weights = np.asarray(row_weights, dtype=np.float32).reshape(-1)
        if len(flat_words) != len(flat_weights):
            raise ValueError(
                "Embedding bias words must have same dimension as embedding bias weights"
            )
        for word, weight in zip(flat_words, flat_weights, strict=True):
            for token in tokenizer.encode(as_text(word), add_special_tokens=False):
                out[row, token] += weight
    return out


def prompt_table_extra_ids(
    input_ids: IntArray, extra_ids: npt.NDArray[Any], vocab_size: int
) -> npt.NDArray[np.uint64]:
    """Per-token extra ids for prompt-table (p-tuning) tokens, those at or past the vocabulary."""
    if extra_ids.shape[0] != input_ids.shape[0]:
        raise ValueError("Prompt table extra id must have the same batch size as Query")
    per_row = extra_ids.reshape(input_ids.shape[0], -1)
    if per_row.shape[1] != 1:
        raise ValueError("Multiple IDs cannot be provided for a single image")
    return np.where(input_ids >= vocab_size, per_row, 0).astype(np.uint64)


def decode(tokenizer: TextTokenizer, ids: Iterable[int], *, skip_special_tokens: bool) -> str:
    """Text of token ids, the same way for whole sequences and streaming windows (no clean-up
    of spaces)."""
    return tokenizer.decode([int(token) for token in ids], skip_special_tokens=skip_special_tokens)


def sequence_ids(tokens: npt.NDArray[Any], lengths: npt.NDArray[Any]) -> list[list[Sequence[int]]]:
    """`TOKENS_BATCH` `[B, beams, L]` cut to `SEQUENCE_LENGTH` `[B, beams]`, as nested lists."""
    tokens = np.asarray(tokens)
    if tokens.ndim == 2:
        tokens = tokens[:, None, :]
    lengths = np.asarray(lengths).reshape(tokens.shape[0], tokens.shape[1])
    return [
        [tokens[b, k, : int(lengths[b, k])].tolist() for k in range(tokens.shape[1])]
        for b in range(tokens.shape[0])
    ]


def text_tensor(texts: Sequence[Sequence[str]]) -> npt.NDArray[np.object_]:
    """Nested strings as a UTF-8 bytes tensor of the same shape."""
    return np.array([[text.encode("utf-8") for text in row] for row in texts], dtype=np.object_)
