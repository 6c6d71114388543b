"""Where prompts' prefixes and LoRA adapters were sent before: the memory affinity routing reads.

Each prompt block and each adapter has one owner, the replica it was first sent to, kept until
it is forgotten (least recently used, or its replica left or was ejected): a request sent
elsewhere because its owner was too busy does not move the ownership, so traffic of one prefix
or adapter stays on one replica while load allows. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence


def block_hashes(
    ids: Sequence[int], block_tokens: int, max_blocks: int, cache_salt: int | None = None
) -> tuple[int, ...]:
    """Chained hashes of the prompt's full leading blocks of ``block_tokens`` tokens.

    The ``i``-th hash stands for the whole prefix up to the end of block ``i`` (as the KV-cache
    blocks an engine can reuse); a partial last block has none. The block size and the
    request's KV-cache salt seed the chain, so hashes of different block sizes never meet, nor
    do those of different cache scopes (whose blocks the engine never shares either).
    """
    count = min(len(ids) // block_tokens, max_blocks)
    tokens = tuple(ids[: count * block_tokens])
    hashes = []
    previous = hash(("blocks", block_tokens, cache_salt))
    for start in range(0, count * block_tokens, block_tokens):
        previous = hash((previous, tokens[start : start + block_tokens]))
        hashes.append(previous)
    return tuple(hashes)


class PrefixIndex:
    """The owner of each prompt block seen lately, at most ``capacity`` blocks."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._owners: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def matches(self, hashes: Sequence[int]) -> dict[str, int]:
        """For each owner, the deepest leading block of the prompt it owns (1-based)."""
        depths: dict[str, int] = {}
        owners = self._owners
        for depth, block in enumerate(hashes, 1):
            owner = owners.get(block)
            if owner is None:
                break
            depths[owner] = depth
        return depths

    def record(self, hashes: Sequence[int], replica: str) -> None:
        """The prompt went to ``replica``: it owns the blocks nobody owned; all are touched."""
        owners = self._owners
        for block in hashes:
            owners[block] = owners.pop(block, replica)
        while len(owners) > self._capacity:
            del owners[next(iter(owners))]

    def forget(self, replica: str) -> None:
        """Drop every block ``replica`` owns (it left, or may have lost its cache)."""
        self._owners = {block: owner for block, owner in self._owners.items() if owner != replica}


class AdapterIndex:
    """The owner of each LoRA adapter, at most ``slots`` adapters owned per replica."""

    def __init__(self, slots: int) -> None:
        self._slots = slots
        self._owner: dict[str, str] = {}
        self._owned: dict[str, dict[str, None]] = {}

    def owner(self, adapter: str) -> str | None:
        """The replica that holds ``adapter``, if one does."""
        return self._owner.get(adapter)

    def has_room(self, replica: str) -> bool:
        """Whether ``replica`` owns fewer adapters than its cache holds."""
        return len(self._owned.get(replica, ())) < self._slots

    def record(self, adapter: str, replica: str) -> None:
        """A request for ``adapter`` went to ``replica``; its least recently used adapter is
        forgotten when that takes it over its slots."""
        owner = self._owner.get(adapter)
        if owner is not None and owner != replica:
            return
        owned = self._owned.setdefault(replica, {})
        owned.pop(adapter, None)
        owned[adapter] = None
        self._owner[adapter] = replica
        while len(owned) > self._slots:
            evicted = next(iter(owned))
            del owned[evicted]
            del self._owner[evicted]

    def forget(self, replica: str) -> None:
        """Drop every adapter ``replica`` owns."""
        for adapter in self._owned.pop(replica, {}):
            del self._owner[adapter]
