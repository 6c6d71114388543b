"""KV-cache block bookkeeping (torch-free): ref-counted blocks, prefix reuse under hash chains of
token ids, reservations that keep admitted sequences from running out, and LRU eviction.

A block holds the keys and values of ``tokens_per_block`` consecutive tokens of a sequence. A
full block is named by a hash chained from the sequence's salt through the token ids of every
block before it and its own, so equal names mean equal content. Blocks nobody references stay
cached under their name until the pool needs them back, least recently used first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from deploy.triton.engine.types import KvCacheStats

BlockHash = bytes
_DIGEST = 16


def blocks_for(tokens: int, tokens_per_block: int) -> int:
    """Blocks that hold ``tokens`` tokens."""
    return -(-tokens // tokens_per_block)


def salt_hash(*parts: bytes | str | int | None) -> BlockHash:
    """The root of a hash chain: everything besides the token ids that decides KV content (the
    model, the LoRA task id). ``None`` parts count too."""
    digest = hashlib.blake2b(digest_size=_DIGEST)
    for part in parts:
        if part is None:
            data = b"\x00"
        elif isinstance(part, int):
            data = b"\x01" + part.to_bytes(16, "little", signed=True)
        else:
            raw = part.encode() if isinstance(part, str) else part
            data = b"\x02" + len(raw).to_bytes(8, "little") + raw
        digest.update(data)
    return digest.digest()


def next_hash(
    parent: BlockHash, tokens: Sequence[int], extra_ids: Sequence[int] | None = None
) -> BlockHash:
    """The name of a full block: its parent's name, its token ids and their extra ids."""
    digest = hashlib.blake2b(parent, digest_size=_DIGEST)
    digest.update(np.asarray(tokens, dtype="<i8").tobytes())
    if extra_ids is not None and any(extra_ids):
        digest.update(b"x" + np.asarray(extra_ids, dtype="<u8").tobytes())
    return digest.digest()


def chain_hashes(
    root: BlockHash,
    tokens: Sequence[int],
    tokens_per_block: int,
    extra_ids: Sequence[int] | None = None,
) -> list[BlockHash]:
    """Names of the full blocks of ``tokens``, in order."""
    hashes: list[BlockHash] = []
    parent = root
    for start in range(0, len(tokens) - tokens_per_block + 1, tokens_per_block):
        end = start + tokens_per_block
        extra = None if extra_ids is None else extra_ids[start:end]
        parent = next_hash(parent, tokens[start:end], extra)
        hashes.append(parent)
    return hashes


@dataclass(eq=False)
class BlockTable:
    """One sequence's KV cache: its blocks in order and the tokens they hold.

    ``hashes`` names its full blocks (the chain from ``root``); ``reserve`` is how many more
    blocks it may take from the pool, set aside when it was admitted.
    """

    root: BlockHash = b""
    blocks: list[int] = field(default_factory=list)
    length: int = 0
    hashes: list[BlockHash] = field(default_factory=list)
    reserve: int = 0


@dataclass
class _Counters:
    alloc_total: int = 0
    alloc_new: int = 0
    reused: int = 0
    missed: int = 0


class BlockManager:
    """The pool's blocks: who holds them, what they hold, and which to evict next.

    Admission reserves every block a request may need (its worst case), so a running sequence
    never finds the pool empty; cached blocks nobody holds count as free and are evicted least
    recently used first. With ``reuse`` off nothing is ever named or found.
    """

    def __init__(self, num_blocks: int, tokens_per_block: int, *, reuse: bool = True) -> None:
        if num_blocks < 1 or tokens_per_block < 1:
            raise ValueError("a KV cache needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.tokens_per_block = tokens_per_block
        self.reuse = reuse
        self._refs = [0] * num_blocks
        self._names: list[BlockHash | None] = [None] * num_blocks
        self._by_name: dict[BlockHash, int] = {}
        self._empty = list(range(num_blocks - 1, -1, -1))
        self._cached: OrderedDict[int, None] = OrderedDict()
        self._reserved = 0
        self._counters = _Counters()

    @property
    def free(self) -> int:
        """Blocks nobody holds: empty, or cached and evictable."""
        return len(self._empty) + len(self._cached)

    @property
    def reserved(self) -> int:
        """Free blocks set aside for admitted sequences."""
        return self._reserved

    def match(self, hashes: Sequence[BlockHash]) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes`` (not yet held)."""
        found: list[int] = []
        if not self.reuse:
            return found
        for name in hashes:
            block = self._by_name.get(name)
            if block is None:
                break
            found.append(block)
        return found

    def admit(self, table: BlockTable, matched: Sequence[int], need: int, missed: int) -> bool:
        """Take ``matched`` blocks into ``table`` and reserve ``need`` more, if the pool can
        hold them beside every earlier reservation; ``missed`` prompt blocks were not found."""
        claimed = sum(1 for block in matched if self._refs[block] == 0)
        if self.free - self._reserved < claimed + need:
            return False
        for block in matched:
            self._hold(block)
        table.blocks.extend(matched)
        table.length = len(table.blocks) * self.tokens_per_block
        table.hashes = [name for name in (self._names[b] for b in matched) if name is not None]
        table.reserve += need
        self._reserved += need
        self._counters.reused += len(matched)
        self._counters.missed += missed
        return True

    def fits(self, need: int) -> bool:
        """Whether an empty pool could ever hold ``need`` blocks for one request."""
        return need <= self.num_blocks

    def grow(self, table: BlockTable, tokens: int) -> int:
        """Give ``table`` room for ``tokens`` more tokens from its reservation; returns how many
        of the new blocks held no cached content."""
        fresh = 0
        while len(table.blocks) * self.tokens_per_block < table.length + tokens:
            block, new = self._allocate()
            fresh += new
            table.blocks.append(block)
            table.reserve -= 1
            self._reserved -= 1
        return fresh

    def commit(
        self,
        table: BlockTable,
        tokens: Sequence[int],
        extra_ids: Sequence[int] | None = None,
    ) -> None:
        """``table`` now holds the KV of ``tokens[:table.length]``: name its newly full blocks,
        making them findable (the first block of a name keeps it)."""
        size = self.tokens_per_block
        while (len(table.hashes) + 1) * size <= table.length:
            index = len(table.hashes)
            start = index * size
            parent = table.hashes[-1] if table.hashes else table.root
            extra = None if extra_ids is None else extra_ids[start : start + size]
            name = next_hash(parent, tokens[start : start + size], extra)
            table.hashes.append(name)
            block = table.blocks[index]
            if self.reuse and name not in self._by_name and self._names[block] is None:
                self._by_name[name] = block
                self._names[block] = name

    def fork(self, table: BlockTable, reserve: int) -> tuple[BlockTable, tuple[int, int] | None]:
        """A second table with ``table``'s tokens: full blocks shared, a partial last block
        copied from ``table``'s reservation into a block of its own. Returns the fork and the
        ``(source, target)`` block copy the caller must make in the pool, if any."""
        size = self.tokens_per_block
        full = table.length // size
        shared = table.blocks[:full]
        for block in shared:
            self._hold(block)
        fork = BlockTable(table.root, list(shared), full * size, list(table.hashes), 0)
        copy = None
        if table.length > full * size:
            block, _ = self._allocate()
            table.reserve -= 1
            self._reserved -= 1
            fork.blocks.append(block)
            fork.length = table.length
            copy = (table.blocks[full], block)
        self.move_reserve(table, fork, reserve)
        return fork, copy

    def regroup(
        self, tables: Sequence[BlockTable], parents: Sequence[int]
    ) -> tuple[list[BlockTable], list[tuple[int, int]]]:
        """Beam search's reordering: beam ``i`` continues ``tables[parents[i]]``. A parent's
        first child keeps its table, later children get forks (full blocks shared, the partial
        last block copied) and tables nobody continues are released. The beams' reservations
        are pooled: what a released table frees goes back into it, every new block comes out of
        it, and it is spread over the new tables. Returns the tables in beam order and the
        ``(source, target)`` block copies the caller must make in the pool."""
        pot = sum(table.reserve for table in tables)
        for table in tables:
            table.reserve = 0
        children: dict[int, list[int]] = {}
        for beam, parent in enumerate(parents):
            children.setdefault(parent, []).append(beam)
        for index, table in enumerate(tables):
            if index not in children:
                free_before = self.free
                self.release(table)
                freed = self.free - free_before
                pot += freed
                self._reserved += freed
        result: list[BlockTable | None] = [None] * len(parents)
        copies: list[tuple[int, int]] = []
        size = self.tokens_per_block
        for parent, beams in children.items():
            table = tables[parent]
            result[beams[0]] = table
            full = table.length // size
            for beam in beams[1:]:
                for block in table.blocks[:full]:
                    self._hold(block)
                fork = BlockTable(table.root, table.blocks[:full], table.length, list(table.hashes))
                if table.length > full * size:
                    block, _ = self._allocate()
                    pot -= 1
                    self._reserved -= 1
                    fork.blocks.append(block)
                    copies.append((table.blocks[full], block))
                result[beam] = fork
        regrouped = [table for table in result if table is not None]
        share, extra = divmod(pot, len(regrouped))
        for index, table in enumerate(regrouped):
            table.reserve = share + (1 if index < extra else 0)
        return regrouped, copies

    def move_reserve(self, source: BlockTable, target: BlockTable, blocks: int) -> None:
        """Hand ``blocks`` of ``source``'s reservation to ``target``."""
        moved = min(blocks, source.reserve)
        source.reserve -= moved
        target.reserve += moved

    def unreserve(self, table: BlockTable) -> None:
        """Give back what ``table`` still had reserved, keeping its blocks."""
        self._reserved -= table.reserve
        table.reserve = 0

    def release(self, table: BlockTable) -> None:
        """Let go of ``table``'s blocks (last first, so a sequence's tail is evicted before
        its head) and of what it still had reserved."""
        for block in reversed(table.blocks):
            self._refs[block] -= 1
            if self._refs[block] > 0:
                continue
            if self._names[block] is not None:
                self._cached[block] = None
            else:
                self._empty.append(block)
        table.blocks.clear()
        table.length = 0
        self._reserved -= table.reserve
        table.reserve = 0

    def stats(self) -> KvCacheStats:
        """A consistent snapshot of the pool."""
        free = self.free
        counters = self._counters
        return KvCacheStats(
            max_blocks=self.num_blocks,
            free_blocks=free,
            used_blocks=self.num_blocks - free,
            tokens_per_block=self.tokens_per_block,
            alloc_total=counters.alloc_total,
            alloc_new=counters.alloc_new,
            reused=counters.reused,
            missed=counters.missed,
            cached_blocks=len(self._cached),
        )

    def _hold(self, block: int) -> None:
        if self._refs[block] == 0:
            self._cached.pop(block, None)
        self._refs[block] += 1

    def _allocate(self) -> tuple[int, bool]:
        """A block from the pool: an empty one, else the least recently used cached one."""
        if self._empty:
            block, new = self._empty.pop(), True
        elif self._cached:
            block, _ = self._cached.popitem(last=False)
            name = self._names[block]
            if name is not None and self._by_name.get(name) == block:
                del self._by_name[name]
            self._names[block] = None
            new = False
        else:
            raise RuntimeError("the KV cache has no free block: a reservation was not honoured")
        self._refs[block] = 1
        self._counters.alloc_total += 1
        self._counters.alloc_new += new
        return block, new
