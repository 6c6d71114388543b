"""Left-padded batch KV cache: per-sequence prefill caches joined into one batch and split again."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from transformers import DynamicCache

logger = logging.getLogger(__name__)

LayerKV = tuple[torch.Tensor, torch.Tensor]


def _layers(cache: DynamicCache) -> list[LayerKV]:
    return [(keys, values) for keys, values, *_ in cache]


def _left_pad(tensor: torch.Tensor, columns: int) -> torch.Tensor:
    if columns == 0:
        return tensor
    shape = list(tensor.shape)
    shape[-2] = columns
    return torch.cat([tensor.new_zeros(shape), tensor], dim=-2)


class BatchKVCache:
    """The KV cache of a decode batch, one row per sequence.

    Rows are left-padded to a common length: `pads[r]` leading columns of row r hold no token
    and are masked out. The wrapped `DynamicCache` grows by one column on every decode step;
    joining and leaving sequences rebuild it (concatenate or slice rows, trim padding).
    """

    def __init__(self, cache: DynamicCache | None, pads: Sequence[int], device: torch.device):
        self.cache = cache
        self.device = device
        self._set_pads(list(pads))

    @classmethod
    def empty(cls, device: torch.device) -> BatchKVCache:
        """A cache with no rows."""
        return cls(None, [], device)

    @classmethod
    def from_prefill(cls, cache: DynamicCache, device: torch.device) -> BatchKVCache:
        """Wrap the single-row cache a prefill produced."""
        return cls(cache, [0], device)

    def _set_pads(self, pads: list[int]) -> None:
        self.pads = pads
        self._pads = torch.tensor(pads, dtype=torch.long, device=self.device)

    def __len__(self) -> int:
        return len(self.pads)

    @property
    def length(self) -> int:
        """Columns per row (padding included)."""
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    def token_counts(self) -> list[int]:
        """Real tokens held per row."""
        length = self.length
        return [length - pad for pad in self.pads]

    def step_inputs(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Attention mask (None without padding) and position ids for one new token per row."""
        length = self.length
        positions = (length - self._pads).unsqueeze(1)
        if not any(self.pads):
            return None, positions
        columns = torch.arange(length + 1, device=self.device).unsqueeze(0)
        return (columns >= self._pads.unsqueeze(1)).long(), positions

    def repeat(self, times: int) -> BatchKVCache:
        """A cache holding each row `times` times in a row (shared prefill of n sequences)."""
        if self.cache is None or times == 1:
            return self
        layers = [
            (keys.repeat_interleave(times, dim=0), values.repeat_interleave(times, dim=0))
            for keys, values in _layers(self.cache)
        ]
        pads = [pad for pad in self.pads for _ in range(times)]
        return BatchKVCache(DynamicCache(ddp_cache_data=layers), pads, self.device)

    def select(self, rows: Sequence[int]) -> None:
        """Keep only `rows`, in that order, and drop padding columns no row needs."""
        if self.cache is None:
            return
        if not rows:
            self.cache = None
            self._set_pads([])
            return
        pads = [self.pads[r] for r in rows]
        trim = min(pads)
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        layers = [
            (keys[index, :, trim:], values[index, :, trim:]) for keys, values in _layers(self.cache)
        ]
        self.cache = DynamicCache(ddp_cache_data=layers)
        self._set_pads([pad - trim for pad in pads])

    def extend(self, other: BatchKVCache) -> None:
        """Append the rows of `other`, left-padding whichever side is shorter."""
        if other.cache is None:
            return
        if self.cache is None:
            self.cache = other.cache
            self._set_pads(list(other.pads))
            return
        length = max(self.length, other.length)
        grow_self, grow_other = length - self.length, length - other.length
        layers = [
            (
                torch.cat([_left_pad(k1, grow_self), _left_pad(k2, grow_other)]),
                torch.cat([_left_pad(v1, grow_self), _left_pad(v2, grow_other)]),
            )
            for (k1, v1), (k2, v2) in zip(_layers(self.cache), _layers(other.cache), strict=True)
        ]
        self.cache = DynamicCache(ddp_cache_data=layers)
        self._set_pads(
            [pad + grow_self for pad in self.pads] + [pad + grow_other for pad in other.pads]
        )
