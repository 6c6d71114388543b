"""The engine's KV store: the block manager's bookkeeping over the torch pool, and what a request
needs of them (admission with prefix reuse, room for new tokens, forks, release)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from deploy.triton.engine.blocks import (
    BlockManager,
    BlockTable,
    blocks_for,
    chain_hashes,
    salt_hash,
)
from deploy.triton.engine.kvcache import KVPool, PagedView, free_device_bytes, pool_blocks
from deploy.triton.engine.runner import ModelRunner
from deploy.triton.engine.types import EngineConfig, EngineRequest, KvCacheStats

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdmittedBlocks:
    """A request let in: its table (cached prefix taken, the rest reserved) and the per-sequence
    worst case of blocks."""

    table: BlockTable
    reused: int
    blocks_per_sequence: int


class KVStore:
    """The paged KV cache of one engine: block tables in, tensors and reuse handled here."""

    def __init__(self, pool: KVPool, manager: BlockManager, model_key: str) -> None:
        self.pool = pool
        self.manager = manager
        self.model_key = model_key

    @classmethod
    def build(cls, runner: ModelRunner, config: EngineConfig, max_seq_len: int) -> KVStore:
        """A pool sized by ``config.kv_cache`` for ``runner``'s model; on the CPU it defaults to
        every batch slot holding ``max_seq_len`` tokens."""
        kv = config.kv_cache
        layout = runner.kv_layout()
        default_tokens = config.max_batch_size * max_seq_len
        free = free_device_bytes(runner.device)
        blocks = pool_blocks(kv, layout, free, default_tokens=default_tokens)
        pool = KVPool(layout, blocks, kv.tokens_per_block, runner.device)
        manager = BlockManager(blocks, kv.tokens_per_block, reuse=kv.enable_reuse)
        return cls(pool, manager, f"{config.model_path}|{layout.dtype}")

    @property
    def tokens_per_block(self) -> int:
        """Tokens of one block."""
        return self.manager.tokens_per_block

    @property
    def capacity(self) -> int:
        """Tokens the whole pool holds."""
        return self.manager.num_blocks * self.manager.tokens_per_block

    def root(self, request: EngineRequest) -> bytes:
        """The salt of a request's hash chain: the model, its ``cache_salt_id`` and its LoRA task
        (prompt-table ids salt the blocks they fall in)."""
        task = request.lora.task_id if request.lora is not None else None
        return salt_hash(self.model_key, request.cache_salt_id, task)

    def worst_case(self, request: EngineRequest, max_new_tokens: int) -> tuple[int, int]:
        """Blocks a request may hold at most: in all, and per sequence (full prompt blocks are
        shared by its sequences)."""
        size = self.tokens_per_block
        prompt = len(request.input_ids)
        per_sequence = blocks_for(prompt + max_new_tokens, size)
        shared = prompt // size
        return shared + request.rows * (per_sequence - shared), per_sequence

    def admit(self, request: EngineRequest, max_new_tokens: int) -> AdmittedBlocks | None:
        """Take the cached prefix of ``request``'s prompt and reserve the rest, or None when
        the pool cannot hold it beside what is already admitted.

        The prompt's last token is always computed (its logits pick the first output), and a
        request asking for context logits computes its whole prompt.
        """
        size = self.tokens_per_block
        prompt = request.input_ids
        total, per_sequence = self.worst_case(request, max_new_tokens)
        table = BlockTable(root=self.root(request))
        matched: list[int] = []
        if self.manager.reuse and not request.return_context_logits:
            hashes = chain_hashes(table.root, prompt[: len(prompt) - 1], size, request.extra_ids)
            matched = self.manager.match(hashes)
        missed = blocks_for(len(prompt), size) - len(matched)
        if not self.manager.admit(table, matched, total - len(matched), missed):
            return None
        return AdmittedBlocks(table, len(matched), per_sequence)

    def grow(self, table: BlockTable, tokens: int) -> int:
        """Room in ``table`` for ``tokens`` more; returns the new blocks that held no cache."""
        return self.manager.grow(table, tokens)

    def commit(self, table: BlockTable, tokens: Sequence[int], extra: Sequence[int] | None) -> None:
        """Make ``table``'s newly full blocks findable by later prompts."""
        if self.manager.reuse:
            self.manager.commit(table, tokens, extra)

    def fork(self, table: BlockTable, reserve: int) -> BlockTable:
        """A copy of ``table`` for another sequence of the same prompt."""
        fork, copy = self.manager.fork(table, reserve)
        if copy is not None:
            self.pool.copy_block(*copy)
        return fork

    def regroup(self, tables: Sequence[BlockTable], parents: Sequence[int]) -> list[BlockTable]:
        """Beam ``i``'s table continues ``tables[parents[i]]`` (see ``BlockManager.regroup``)."""
        regrouped, copies = self.manager.regroup(tables, parents)
        for source, target in copies:
            self.pool.copy_block(source, target)
        return regrouped

    def release(self, table: BlockTable) -> None:
        """Return ``table``'s blocks (cached ones stay findable until evicted)."""
        self.manager.release(table)

    def view(self, tables: Sequence[BlockTable], count: int) -> PagedView:
        """The cache view of a forward pass adding ``count`` tokens to each table."""
        return self.pool.view([t.blocks for t in tables], [t.length for t in tables], count)

    def stats(self) -> KvCacheStats:
        """The pool's counts."""
        return self.manager.stats()
