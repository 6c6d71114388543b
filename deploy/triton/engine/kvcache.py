"""The paged KV cache in torch: per-layer pools of token slots, grouped in blocks, and the
``transformers`` cache views one forward pass reads and writes them through.

Slot ``b * tokens_per_block + i`` of every layer's pool holds token ``i`` of block ``b``. A
forward pass gets a view over some sequences' block tables: each layer writes its new keys and
values into their slots and reads back every row's tokens, left-padded to a common length, so
the model sees an ordinary batch of padded caches (any attention implementation, sliding
windows included).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

from deploy.triton.engine.types import EngineError, KvCacheConfig

logger = logging.getLogger(__name__)

_PROBE_TOKEN = 0


@dataclass(frozen=True)
class KVLayout:
    """The keys and values a model caches per token: ``(kv_heads, head_dim)`` per layer."""

    heads: tuple[tuple[int, int], ...]
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        """Cache memory of one token, keys and values of every layer."""
        size = torch.empty(0, dtype=self.dtype).element_size()
        return sum(2 * heads * dim * size for heads, dim in self.heads)

    @classmethod
    def probe(cls, model: Any, device: torch.device, cache_arg: str) -> KVLayout:
        """Run one token through ``model`` to see what each of its layers caches."""
        cache = DynamicCache()
        ids = torch.tensor([[_PROBE_TOKEN]], dtype=torch.long, device=device)
        with torch.inference_mode():
            model(input_ids=ids, use_cache=True, **{cache_arg: cache})
        heads = []
        dtype = torch.float32
        for layer in cache.layers:
            keys = getattr(layer, "keys", None)
            if not isinstance(layer, DynamicLayer) or keys is None or keys.dim() != 4:
                raise EngineError(
                    f"the model's cache layer {type(layer).__name__} is not attention keys and "
                    "values: the torch engine's paged KV cache cannot hold it"
                )
            heads.append((int(keys.shape[1]), int(keys.shape[3])))
            dtype = keys.dtype
        return cls(tuple(heads), dtype)


def free_device_bytes(device: torch.device) -> int | None:
    """Memory free on a CUDA device now; None on the CPU, whose pool is sized in tokens."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def pool_blocks(
    config: KvCacheConfig,
    layout: KVLayout,
    free_bytes: int | None,
    *,
    default_tokens: int,
) -> int:
    """How many blocks the pool gets: ``max_tokens``, else ``default_tokens`` (every batch slot
    at full length); on CUDA (``free_bytes`` known) at most ``free_gpu_mem_fraction`` of the free
    memory. Unlike a TensorRT-LLM engine, whose activations are allocated before the pool is
    sized, this engine allocates them as it runs: a pool no larger than the batch can use leaves
    them the rest of the device (and room for other models on it)."""
    per_block = layout.bytes_per_token * config.tokens_per_block
    tokens = config.max_tokens if config.max_tokens is not None else default_tokens
    blocks = (
        tokens // config.tokens_per_block
        if config.max_tokens is not None
        else (-(-tokens // config.tokens_per_block))
    )
    if free_bytes is not None:
        blocks = min(blocks, int(free_bytes * config.free_gpu_mem_fraction) // per_block)
    if blocks < 1:
        raise EngineError(
            f"the KV cache has room for no block of {config.tokens_per_block} tokens "
            f"({per_block} bytes each)"
        )
    return blocks


class KVPool:
    """Every layer's keys and values, ``[num_blocks * tokens_per_block, heads, head_dim]``."""

    def __init__(
        self, layout: KVLayout, num_blocks: int, tokens_per_block: int, device: torch.device
    ) -> None:
        self.layout = layout
        self.num_blocks = num_blocks
        self.tokens_per_block = tokens_per_block
        self.device = device
        slots = num_blocks * tokens_per_block
        # Untouched pages of an empty CPU tensor cost no memory until a block is first written.
        self.keys = [
            torch.empty(slots, h, d, dtype=layout.dtype, device=device) for h, d in layout.heads
        ]
        self.values = [
            torch.empty(slots, h, d, dtype=layout.dtype, device=device) for h, d in layout.heads
        ]
        logger.info(
            "KV cache: %d blocks of %d tokens, %.1f MiB",
            num_blocks,
            tokens_per_block,
            slots * layout.bytes_per_token / 2**20,
        )

    def copy_block(self, source: int, target: int) -> None:
        """Copy one block's keys and values into another block."""
        size = self.tokens_per_block
        src = slice(source * size, (source + 1) * size)
        dst = slice(target * size, (target + 1) * size)
        for keys, values in zip(self.keys, self.values, strict=True):
            keys[dst] = keys[src]
            values[dst] = values[src]

    def slots(self, tables: Sequence[Sequence[int]], starts: Sequence[int], count: int) -> Slots:
        """Where a forward pass writing ``count`` tokens per row reads and writes, row ``r`` at
        positions ``starts[r]...`` of the sequence whose blocks are ``tables[r]``."""
        device = self.device
        size = self.tokens_per_block
        start = torch.tensor(list(starts), dtype=torch.long, device=device)
        total = start + count
        width = int(total.max())
        pads = width - total
        columns = torch.arange(width, device=device).unsqueeze(0) - pads.unsqueeze(1)
        longest = max(len(table) for table in tables)
        table = torch.tensor(
            [list(t) + [0] * (longest - len(t)) for t in tables], dtype=torch.long, device=device
        )
        positions = columns.clamp(min=0)
        read = table.gather(1, positions // size) * size + positions % size
        new = start.unsqueeze(1) + torch.arange(count, device=device).unsqueeze(0)
        write = table.gather(1, new // size) * size + new % size
        mask = (columns >= 0).long() if bool(pads.any()) else None
        return Slots(read, write.reshape(-1), new, mask, width - count)

    def view(self, tables: Sequence[Sequence[int]], starts: Sequence[int], count: int) -> PagedView:
        """A cache view for a forward pass writing ``count`` tokens per row (see ``slots``)."""
        return PagedView(self, self.slots(tables, starts, count))


@dataclass(frozen=True)
class Slots:
    """Pool slots of one forward pass over padded rows."""

    read: torch.Tensor
    """Slots every row reads, left-padded to a common length: ``[rows, past + count]``."""
    write: torch.Tensor
    """Slots of the new tokens, row after row: ``[rows * count]``."""
    positions: torch.Tensor
    """Position ids of the new tokens: ``[rows, count]``."""
    mask: torch.Tensor | None
    """2-D padding mask ``[rows, past + count]``; None when no row is padded."""
    past: int
    """The padded length before the pass."""


class PoolLayer(CacheLayerMixin):  # type: ignore[misc]
    """A ``transformers`` cache layer over one layer's keys and values in the pool, for one
    forward pass; subclasses write the new tokens and say what attention reads."""

    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self._pool = (keys, values)
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def get_max_length(self) -> int:
        return -1

    def _store(self, write: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write a pass's new keys and values ``[rows, heads, count, dim]`` to the slots
        ``write``, row after row."""
        for pool, states in zip(self._pool, (keys, values), strict=True):
            pool.index_copy_(0, write, states.transpose(1, 2).reshape(-1, *pool.shape[1:]))


def gather(pool: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """A layer's keys or values at the slots ``read`` ``[rows, columns]``, as attention reads
    them: ``[rows, heads, columns, dim]``."""
    rows, columns = read.shape
    gathered = pool.index_select(0, read.reshape(-1))
    return gathered.view(rows, columns, *pool.shape[1:]).transpose(1, 2)


class _PagedLayer(PoolLayer):
    """One layer's window on the pool for one forward pass."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, view: PagedView) -> None:
        super().__init__(keys, values)
        self._view = view

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._store(self._view.write, key_states, value_states)
        keys, values = self._pool
        return gather(keys, self._view.read), gather(values, self._view.read)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._view.past + query_length, 0

    def get_seq_length(self) -> int:
        return self._view.past


class PagedView(Cache):  # type: ignore[misc]
    """The ``transformers`` cache of one forward pass over block tables of the pool.

    ``positions`` are the new tokens' position ids ``[rows, count]``; ``attention_mask`` is
    the 2-D padding mask ``[rows, past + count]`` (None when no row is padded); ``past`` is
    the padded length before this pass.
    """

    def __init__(self, pool: KVPool, slots: Slots) -> None:
        self.read = slots.read
        self.write = slots.write
        self.positions = slots.positions
        self.attention_mask = slots.mask
        self.past = slots.past
        layers: list[Any] = [
            _PagedLayer(keys, values, self)
            for keys, values in zip(pool.keys, pool.values, strict=True)
        ]
        super().__init__(layers=layers)
