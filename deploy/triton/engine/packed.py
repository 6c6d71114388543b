"""Packed forward passes: the decode step's rows and prompt chunks as ONE row of tokens through
the model, as TensorRT-LLM's in-flight batching runs context and generation requests together.

The model's own attention sees a padded batch, which would pad every decode row to the longest
chunk. Here the tokens go in packed instead (decode rows first, one token each, then every chunk's
tokens), and attention is this module's function: it writes the new keys and values to the
paged pool and attends per part, the decode rows as one padded batch of single queries and each
chunk causally over its sequence's cache. Everything else in the model (projections, norms,
rotary positions, MLPs) runs once over all the tokens.

Only models whose attention is plain scaled dot-product attention can run packed (no sliding
window, logit soft-capping or attention sinks): the engine checks at load that a packed pass gives
the logits of separate ones, and runs separate passes where it does not.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache

from deploy.triton.engine.kvcache import KVPool, PoolLayer, gather

logger = logging.getLogger(__name__)

ATTENTION = "tgw_packed"
"""The attention implementation's name in ``transformers``' registry."""
_UNSUPPORTED = ("sliding_window", "softcap", "s_aux")
_active = threading.local()


class PackedUnsupported(RuntimeError):
    """The model's attention asks for something packed attention does not do."""


@dataclass(frozen=True)
class Chunk:
    """A prompt chunk's part of a packed pass: its sequence's slots up to the chunk's end."""

    read: torch.Tensor
    """Pool slots of the sequence's tokens, past and new: ``[1, past + count]``."""
    count: int
    mask: torch.Tensor | None
    """Causal mask ``[1, 1, count, past + count]`` over a cached past; None without one."""


@dataclass(frozen=True)
class PackedPlan:
    """What attention reads in one packed pass."""

    rows: int
    """Decode rows, one token each, packed first."""
    row_read: torch.Tensor | None
    """Pool slots each decode row attends to, left-padded: ``[rows, columns]``."""
    row_mask: torch.Tensor | None
    """Padding mask ``[rows, 1, 1, columns]`` (True where a row has a token); None unpadded."""
    chunks: tuple[Chunk, ...]


def plan(
    pool: KVPool,
    rows: Sequence[tuple[Sequence[int], int]],
    chunks: Sequence[tuple[Sequence[int], int, int]],
) -> tuple[PackedPlan, torch.Tensor, torch.Tensor]:
    """The plan of a pass over decode ``rows`` (blocks, length) and prompt ``chunks`` (blocks,
    tokens cached, tokens added); with the pool slots the pass writes and the position ids
    ``[1, tokens]``, both in packed order."""
    writes: list[torch.Tensor] = []
    positions: list[torch.Tensor] = []
    row_read = row_mask = None
    if rows:
        slots = pool.slots([blocks for blocks, _ in rows], [length for _, length in rows], 1)
        row_read = slots.read
        if slots.mask is not None:
            row_mask = slots.mask.bool()[:, None, None, :]
        writes.append(slots.write)
        positions.append(slots.positions.reshape(-1))
    parts = []
    for blocks, past, count in chunks:
        slots = pool.slots([blocks], [past], count)
        writes.append(slots.write)
        positions.append(slots.positions.reshape(-1))
        mask = None
        if past:
            keys = torch.arange(past + count, device=pool.device)
            queries = torch.arange(past, past + count, device=pool.device)
            mask = (keys.unsqueeze(0) <= queries.unsqueeze(1))[None, None]
        parts.append(Chunk(slots.read, count, mask))
    packed = PackedPlan(len(rows), row_read, row_mask, tuple(parts))
    return packed, torch.cat(writes), torch.cat(positions).unsqueeze(0)


@contextmanager
def active(packed: PackedPlan) -> Iterator[None]:
    """Run the forward passes inside with ``packed`` as their attention's plan."""
    _active.plan = packed
    try:
        yield
    finally:
        _active.plan = None


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of a packed pass: ``query`` is ``[1, heads, tokens, dim]``; ``key`` and
    ``value`` are the layer's whole pools ``[slots, kv_heads, dim]`` (see ``PackedView``).
    Returns ``[1, tokens, heads, dim]``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    packed: PackedPlan | None = getattr(_active, "plan", None)
    if packed is None:
        raise PackedUnsupported("packed attention ran outside a packed forward pass")
    for name in _UNSUPPORTED:
        if kwargs.get(name) is not None:
            raise PackedUnsupported(f"the model's attention uses {name}")
    outputs = []
    rows = packed.rows
    if rows:
        assert packed.row_read is not None
        read = packed.row_read
        queries = query[0, :, :rows].transpose(0, 1).unsqueeze(2)
        out, _ = sdpa_attention_forward(
            module, queries, gather(key, read), gather(value, read), packed.row_mask,
            scaling=scaling, is_causal=False,
        )  # fmt: skip
        outputs.append(out.reshape(1, rows, out.shape[-2], out.shape[-1]))
    offset = rows
    for chunk in packed.chunks:
        queries = query[:, :, offset : offset + chunk.count]
        out, _ = sdpa_attention_forward(
            module, queries, gather(key, chunk.read), gather(value, chunk.read), chunk.mask,
            scaling=scaling, is_causal=chunk.mask is None,
        )  # fmt: skip
        outputs.append(out)
        offset += chunk.count
    return torch.cat(outputs, dim=1), None


def register() -> bool:
    """Make ``ATTENTION`` an attention implementation of ``transformers``; False where this
    version has no registry for it."""
    try:
        from transformers import AttentionInterface
    except ImportError:
        return False
    AttentionInterface.register(ATTENTION, attention)
    return True


class _PackedLayer(PoolLayer):
    """One layer's pools for one packed pass: new keys and values go to their slots, and
    attention gets the whole pools."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, write: torch.Tensor) -> None:
        super().__init__(keys, values)
        self._write = write

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._store(self._write, key_states, value_states)
        return self._pool

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0

    def get_seq_length(self) -> int:
        return 0


class PackedView(Cache):  # type: ignore[misc]
    """The ``transformers`` cache of one packed pass."""

    def __init__(self, pool: KVPool, write: torch.Tensor) -> None:
        layers: list[Any] = [
            _PackedLayer(keys, values, write)
            for keys, values in zip(pool.keys, pool.values, strict=True)
        ]
        super().__init__(layers=layers)
