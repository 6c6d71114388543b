"""The KV-cache handoff's pieces: blocks gathered from one pool and scattered into another, the
held requests' registry, and the transfer server over its local socket (in one process)."""

from __future__ import annotations

import threading

import pytest
import torch

from deploy.triton.engine.blocks import BlockTable
from deploy.triton.engine.disagg.phase import BadContextPhase, KvTransfer
from deploy.triton.engine.disagg.transfer import (
    Handoffs,
    TransferServer,
    fetch_blocks,
    gather_blocks,
    scatter_blocks,
)
from deploy.triton.engine.kvcache import KVLayout, KVPool

LAYOUT = KVLayout(((2, 4), (1, 8)), torch.float32)
SIZE = 4


def _pool(seed: int) -> KVPool:
    pool = KVPool(LAYOUT, 6, SIZE, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    for tensor in (*pool.keys, *pool.values):
        tensor.copy_(torch.randn(tensor.shape, generator=generator))
    return pool


def _block(pool: KVPool, block: int) -> list[torch.Tensor]:
    rows = slice(block * SIZE, (block + 1) * SIZE)
    return [tensor[rows].clone() for tensor in (*pool.keys, *pool.values)]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_blocks_gathered_from_one_pool_land_in_the_blocks_of_another() -> None:
    source, target = _pool(1), _pool(2)
    untouched = _block(target, 1)
    data = gather_blocks(source, [3, 5])
    assert data.dtype == torch.uint8
    assert data.numel() == 2 * SIZE * LAYOUT.bytes_per_token
    scatter_blocks(target, [0, 2], data)
    assert _same(_block(target, 0), _block(source, 3))
    assert _same(_block(target, 2), _block(source, 5))
    assert _same(_block(target, 1), untouched)


def test_a_held_request_is_taken_once() -> None:
    handoffs = Handoffs(60.0)
    table = BlockTable(blocks=[1, 2])
    handoff_id = handoffs.hold(table, 8)
    assert handoffs.next_deadline_s() is not None
    held = handoffs.take(handoff_id)
    assert held is not None and held.table is table
    assert handoffs.take(handoff_id) is None
    assert handoffs.next_deadline_s() is None


def test_a_held_request_nobody_takes_expires() -> None:
    handoffs = Handoffs(0.0)
    table = BlockTable(blocks=[1])
    handoff_id = handoffs.hold(table, 4)
    assert handoffs.expired() == [table]
    assert handoffs.take(handoff_id) is None
    assert handoffs.expired() == []


def test_a_held_request_its_client_stopped_is_dropped_and_cannot_be_taken() -> None:
    handoffs = Handoffs(60.0)
    mine, other = BlockTable(blocks=[1]), BlockTable(blocks=[2])
    handoff_id = handoffs.hold(mine, 4, "0:req/0")
    handoffs.hold(other, 4, "1:other/0")
    assert handoffs.drop("0:req/0") == [mine]
    assert handoffs.take(handoff_id) is None
    assert handoffs.drop("0:req/0") == []
    assert handoffs.next_deadline_s() is not None


def test_the_server_sends_the_blocks_after_those_the_taker_has() -> None:
    source, target = _pool(3), _pool(4)
    handoffs = Handoffs(60.0)
    taken: list[tuple[BlockTable, KvTransfer]] = []
    done = threading.Event()

    def on_taken(table: BlockTable, transfer: KvTransfer) -> None:
        taken.append((table, transfer))
        done.set()

    server = TransferServer(source, handoffs, on_taken)
    try:
        table = BlockTable(blocks=[4, 1, 2, 0], length=3 * SIZE + 1)
        handoff_id = handoffs.hold(table, table.length)
        transfer = fetch_blocks(server.address, handoff_id, 1, target, [5, 3, 0])
        assert (transfer.blocks, transfer.bytes) == (3, 3 * SIZE * LAYOUT.bytes_per_token)
        for mine, theirs in ((5, 1), (3, 2), (0, 0)):
            assert _same(_block(target, mine), _block(source, theirs))
        assert done.wait(10)
        assert taken[0][0] is table and taken[0][1].blocks == 3
        with pytest.raises(BadContextPhase, match="taken already"):
            fetch_blocks(server.address, handoff_id, 1, target, [5, 3, 0])
    finally:
        server.close()


def test_an_address_nobody_serves_is_named_in_the_error() -> None:
    with pytest.raises(BadContextPhase, match="cannot be reached"):
        fetch_blocks("unix-abstract:nobody-serves-this", "0" * 32, 0, _pool(5), [0])
    with pytest.raises(BadContextPhase, match="unknown address"):
        fetch_blocks("tcp://10.0.0.1:1", "0" * 32, 0, _pool(5), [0])
