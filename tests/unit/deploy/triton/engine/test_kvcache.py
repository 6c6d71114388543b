"""The KV store's pure logic: block naming, reuse, reservations, forks, eviction, and the paged
cache view's slots and masks."""

from __future__ import annotations

import pytest
import torch

from deploy.triton.engine.blocks import (
    BlockManager,
    BlockTable,
    blocks_for,
    chain_hashes,
    next_hash,
    salt_hash,
)
from deploy.triton.engine.kvcache import KVLayout, KVPool, pool_blocks
from deploy.triton.engine.types import EngineError, KvCacheConfig

ROOT = salt_hash("model", None)


@pytest.mark.parametrize(
    ("tokens", "size", "blocks"),
    [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (64, 32, 2), (65, 32, 3)],
)
def test_blocks_for(tokens: int, size: int, blocks: int) -> None:
    assert blocks_for(tokens, size) == blocks


@pytest.mark.parametrize(
    ("left", "right", "same"),
    [
        (("m", None), ("m", None), True),
        (("m", 7), ("m", None), False),  # a LoRA adapter changes the cache
        (("m", 7), ("m", 8), False),
        (("m", 0), ("m", None), False),  # task 0 is not "no adapter"
        (("m", None), ("other", None), False),
        (("m|torch.float32", None), ("m|torch.bfloat16", None), False),
    ],
)
def test_salt_separates_what_changes_the_cache(left: tuple, right: tuple, same: bool) -> None:  # type: ignore[type-arg]
    assert (salt_hash(*left) == salt_hash(*right)) is same


def test_chain_names_full_blocks_by_everything_before_them() -> None:
    tokens = list(range(10))
    hashes = chain_hashes(ROOT, tokens, 4)
    assert len(hashes) == 2  # the last 2 tokens fill no block
    assert hashes[0] == next_hash(ROOT, tokens[:4])
    assert hashes[1] == next_hash(hashes[0], tokens[4:8])
    changed_first = chain_hashes(ROOT, [99, *tokens[1:]], 4)
    assert changed_first[0] != hashes[0] and changed_first[1] != hashes[1]
    assert chain_hashes(salt_hash("model", 3), tokens, 4) != hashes
    extra = [0] * 6 + [5, 0, 0, 0]  # a prompt-table id in the second block
    with_extra = chain_hashes(ROOT, tokens, 4, extra)
    assert with_extra[0] == hashes[0] and with_extra[1] != hashes[1]
    assert chain_hashes(ROOT, tokens, 4, [0] * 10) == hashes


def _filled(manager: BlockManager, tokens: list[int], need: int = 0) -> BlockTable:
    """A sequence admitted with nothing cached whose ``tokens`` are all in the cache."""
    table = BlockTable(root=ROOT)
    assert manager.admit(table, [], need or blocks_for(len(tokens), manager.tokens_per_block), 0)
    manager.grow(table, len(tokens))
    table.length = len(tokens)
    manager.commit(table, tokens)
    return table


def test_a_finished_sequence_leaves_its_full_blocks_findable() -> None:
    manager = BlockManager(8, 4)
    tokens = list(range(10))
    table = _filled(manager, tokens)
    assert manager.stats().used_blocks == 3
    manager.release(table)
    stats = manager.stats()
    assert (stats.free_blocks, stats.used_blocks, stats.cached_blocks) == (8, 0, 2)
    hashes = chain_hashes(ROOT, tokens, 4)
    assert len(manager.match(hashes)) == 2
    assert manager.match(chain_hashes(salt_hash("model", 1), tokens, 4)) == []
    assert len(manager.match(chain_hashes(ROOT, [0, 1, 2, 3, 9, 9, 9, 9], 4))) == 1


def test_admission_takes_the_cached_prefix_and_reserves_the_rest() -> None:
    manager = BlockManager(6, 4)
    prompt = list(range(9))
    manager.release(_filled(manager, prompt))
    table = BlockTable(root=ROOT)
    matched = manager.match(chain_hashes(ROOT, prompt[:-1], 4))
    assert len(matched) == 2
    assert manager.admit(table, matched, need=2, missed=1)
    assert (table.length, table.reserve, manager.reserved) == (8, 2, 2)
    stats = manager.stats()
    assert (stats.used_blocks, stats.reused, stats.missed) == (2, 2, 1)
    assert manager.grow(table, 1) == 1  # an empty block: nothing evicted
    other = BlockTable(root=ROOT)
    assert not manager.admit(other, [], need=3, missed=0)  # 3 free, 1 of them reserved
    assert manager.admit(other, [], need=2, missed=0)
    manager.release(table)
    assert manager.reserved == 2


def test_eviction_takes_the_least_recently_used_tail_first() -> None:
    manager = BlockManager(4, 2)
    first = list(range(4))
    manager.release(_filled(manager, first))
    second = [9, 9, 8, 8]
    manager.release(_filled(manager, second))
    assert manager.stats().cached_blocks == 4
    # Two new blocks evict the oldest release's blocks, its tail before its head.
    table = _filled(manager, [7, 7, 6, 6])
    assert manager.stats().alloc_new == 4  # only the first two sequences took empty blocks
    assert manager.match(chain_hashes(ROOT, first, 2)) == []
    assert len(manager.match(chain_hashes(ROOT, second, 2))) == 2
    manager.release(table)


def test_reuse_off_names_nothing() -> None:
    manager = BlockManager(4, 2, reuse=False)
    tokens = [1, 2, 3, 4]
    manager.release(_filled(manager, tokens))
    assert manager.match(chain_hashes(ROOT, tokens, 2)) == []
    assert manager.stats().cached_blocks == 0


def test_fork_shares_full_blocks_and_copies_the_partial_one() -> None:
    manager = BlockManager(8, 4)
    table = _filled(manager, list(range(6)), need=6)
    fork, copy = manager.fork(table, reserve=1)
    assert fork.blocks[0] == table.blocks[0]
    assert copy == (table.blocks[1], fork.blocks[1])
    assert fork.length == 6 and fork.reserve == 1
    assert manager.stats().used_blocks == 3
    manager.release(table)
    assert manager.stats().used_blocks == 2  # the shared block is still held by the fork
    manager.release(fork)
    assert manager.stats().used_blocks == 0 and manager.reserved == 0


def test_equal_content_is_named_once() -> None:
    manager = BlockManager(8, 2)
    first = _filled(manager, [1, 2])
    second = _filled(manager, [1, 2])
    manager.release(first)
    manager.release(second)
    stats = manager.stats()
    assert stats.cached_blocks == 1 and stats.free_blocks == 8


def test_paged_view_left_pads_rows_and_writes_each_at_its_position() -> None:
    layout = KVLayout(((1, 2),), torch.float32)
    pool = KVPool(layout, num_blocks=6, tokens_per_block=2, device=torch.device("cpu"))
    # Row 0 holds 3 tokens in blocks 4, 1; row 1 holds 1 token in block 5.
    view = pool.view([[4, 1], [5]], [3, 1], 1)
    assert view.past == 3
    assert view.positions.tolist() == [[3], [1]]
    assert view.write.tolist() == [1 * 2 + 1, 5 * 2 + 1]
    assert view.attention_mask is not None
    assert view.attention_mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert view.read[0].tolist() == [8, 9, 2, 3]
    assert view.read[1, 2:].tolist() == [10, 11]
    pool.keys[0].zero_()
    keys = torch.arange(2, dtype=torch.float32).view(2, 1, 1, 1).expand(2, 1, 1, 2)
    gathered, _ = view.layers[0].update(keys, keys)
    assert gathered.shape == (2, 1, 4, 2)
    assert gathered[0, 0, 3].tolist() == [0.0, 0.0] and gathered[1, 0, 3].tolist() == [1.0, 1.0]
    assert pool.keys[0][11].tolist() == [[1.0, 1.0]]


def test_a_prefill_view_continues_a_cached_prefix() -> None:
    layout = KVLayout(((1, 2), (2, 4)), torch.float32)
    pool = KVPool(layout, num_blocks=4, tokens_per_block=4, device=torch.device("cpu"))
    view = pool.view([[3, 0]], [4], 3)
    assert (view.past, view.attention_mask) == (4, None)
    assert view.positions.tolist() == [[4, 5, 6]]
    assert view.write.tolist() == [0, 1, 2]
    assert view.read.tolist() == [[12, 13, 14, 15, 0, 1, 2]]
    assert layout.bytes_per_token == 2 * (1 * 2 + 2 * 4) * 4


# SmolLM2-135M's cache: 30 layers of 3 KV heads of 64 in bfloat16, 23,040 bytes a token.
SMOLLM2 = KVLayout(((3, 64),) * 30, torch.bfloat16)
GIB = 2**30


@pytest.mark.parametrize(
    ("config", "free_bytes", "blocks"),
    [
        # CUDA: the fraction of the free memory, in whole blocks of 32 tokens (737,280 bytes).
        (KvCacheConfig(), GIB // 2, int(GIB // 2 * 0.9) // 737_280),
        (KvCacheConfig(free_gpu_mem_fraction=0.5), GIB // 2, GIB // 4 // 737_280),
        (KvCacheConfig(max_tokens=3200), 10 * GIB, 100),  # max_tokens_in_paged_kv_cache caps it
        (KvCacheConfig(tokens_per_block=64), GIB // 2, int(GIB // 2 * 0.9) // 1_474_560),
        # ...and no more than the batch can use, leaving the device to activations; more only
        # where max_tokens asks for it.
        (KvCacheConfig(), 10 * GIB, 16 * 2048 // 32),
        (KvCacheConfig(max_tokens=64 * 2048), 10 * GIB, 64 * 2048 // 32),
        # The CPU: the default of every batch slot at full length, or max_tokens.
        (KvCacheConfig(), None, 16 * 2048 // 32),
        (KvCacheConfig(tokens_per_block=64), None, 16 * 2048 // 64),
        (KvCacheConfig(max_tokens=1000), None, 31),
    ],
)
def test_the_pool_is_sized_by_the_budget(
    config: KvCacheConfig, free_bytes: int | None, blocks: int
) -> None:
    assert pool_blocks(config, SMOLLM2, free_bytes, default_tokens=16 * 2048) == blocks


def test_a_budget_without_room_for_a_block_is_refused() -> None:
    with pytest.raises(EngineError, match="no block of 32 tokens"):
        pool_blocks(KvCacheConfig(), SMOLLM2, 500_000, default_tokens=0)
    with pytest.raises(EngineError, match="no block"):
        pool_blocks(KvCacheConfig(max_tokens=16), SMOLLM2, None, default_tokens=4096)
