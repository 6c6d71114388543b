"""Incremental (streaming) detokenization with prefix/read offsets, and a per-request cache."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"

Decode = Callable[[Sequence[int]], str]


@dataclass
class IncrementalDetokenizer:
    """Streaming text of one token sequence whose deltas concatenate to the whole decoded text.

    Each step decodes only a short window: the tokens of the previous emitted chunk (the prefix,
    giving context for leading spaces) plus the tokens not yet emitted. Text that ends in an
    incomplete UTF-8 character is held back until a later token completes it. This is the
    algorithm of vLLM's ``detokenize_incrementally`` and TGI's ``decode_token``.
    """

    window: list[int] = field(default_factory=list)
    """Tokens from the prefix offset on; earlier tokens are no longer needed."""
    read_offset: int = 0
    """Index in ``window`` of the first token whose text has not been emitted."""

    @property
    def pending(self) -> bool:
        """Whether some tokens' text has not been emitted yet."""
        return self.read_offset < len(self.window)

    def extend(self, new_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """Add tokens; returns the (prefix, full) windows whose texts ``advance`` needs."""
        self.window.extend(int(token) for token in new_ids)
        return self.window[: self.read_offset], list(self.window)

    def advance(self, prefix_text: str, full_text: str, *, final: bool = False) -> str:
        """The new text given the decoded windows; ``final`` also releases held-back text."""
        complete = len(full_text) > len(prefix_text) and not full_text.endswith(REPLACEMENT_CHAR)
        if not (complete or final):
            return ""
        delta = full_text[len(prefix_text) :]
        self.window = self.window[self.read_offset :]
        self.read_offset = len(self.window)
        return delta

    def step(self, new_ids: Sequence[int], decode: Decode, *, final: bool = False) -> str:
        """Add tokens and return the new text, decoding locally with ``decode``."""
        prefix, full = self.extend(new_ids)
        return self.advance(decode(prefix) if prefix else "", decode(full), final=final)

    def flush(self, decode: Decode) -> str:
        """Whatever text is still held back (an incomplete character at the very end)."""
        return self.step((), decode, final=True)


class IncrementalText(Protocol):
    """The text of one generated sequence from its token ids, as they stream in."""

    def step(self, ids: Sequence[int]) -> str:
        """Text of the new tokens that is complete so far."""
        ...

    def flush(self) -> str:
        """What is still held back, at the end of the sequence."""
        ...


class WindowedText:
    """``IncrementalText`` by ``IncrementalDetokenizer``: a short window decoded at a time by any
    ``decode`` function, holding back an incomplete UTF-8 character."""

    __slots__ = ("_decode", "_detokenizer")

    def __init__(self, decode: Decode) -> None:
        self._detokenizer = IncrementalDetokenizer()
        self._decode = decode

    def step(self, ids: Sequence[int]) -> str:
        """Text of the new tokens that is complete so far."""
        return self._detokenizer.step(ids, self._decode)

    def flush(self) -> str:
        """What is still held back, at the end of the sequence."""
        if not self._detokenizer.pending:
            return ""
        return self._detokenizer.flush(self._decode)


@dataclass
class _Entry:
    detokenizer: IncrementalDetokenizer
    last_used: float


class DetokenizerCache:
    """Per-key detokenizer state, bounded by entry count (LRU) and idle time (TTL)."""

    def __init__(
        self,
        *,
        max_entries: int = 4096,
        ttl_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable) -> IncrementalDetokenizer:
        """The state of ``key``, created when absent or expired; marks it most recently used."""
        now = self._clock()
        self._evict_expired(now)
        entry = self._entries.get(key)
        if entry is None:
            entry = _Entry(IncrementalDetokenizer(), now)
            self._entries[key] = entry
        else:
            entry.last_used = now
            self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return entry.detokenizer

    def discard(self, key: Hashable) -> None:
        """Forget ``key`` (when its sequence is known to be over)."""
        self._entries.pop(key, None)

    def _evict_expired(self, now: float) -> None:
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if now - oldest.last_used <= self._ttl_s:
                return
            self._entries.popitem(last=False)
