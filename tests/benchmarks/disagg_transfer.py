"""KV-cache handoff between two processes: milliseconds per handoff by block count, through the
engine's transfer server (a local socket on the CPU, CUDA IPC between CUDA pools) and, on the
CPU, through a shared-memory segment for comparison.

    python -m tests.benchmarks.disagg_transfer                  # CPU; CUDA too where present
    python -m tests.benchmarks.disagg_transfer --blocks 1,8,64 --repeats 5

The default layout is a Llama-3-8B's cache (32 layers, 8 KV heads of 128, bfloat16, 32-token
blocks: 4 MiB a block). Each figure is the median of ``--repeats`` handoffs, from the
generation side's request to the blocks in its pool.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import torch

from deploy.triton.engine.blocks import BlockTable
from deploy.triton.engine.disagg.phase import KvTransfer
from deploy.triton.engine.disagg.transfer import (
    Handoffs,
    TransferServer,
    fetch_blocks,
    gather_blocks,
    scatter_blocks,
)
from deploy.triton.engine.kvcache import KVLayout, KVPool

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _pool(args: argparse.Namespace, device: str) -> KVPool:
    layout = KVLayout(((args.heads, args.dim),) * args.layers, _DTYPES[args.dtype])
    pool = KVPool(layout, max(args.block_counts), args.tokens_per_block, torch.device(device))
    for tensor in (*pool.keys, *pool.values):
        tensor.normal_()
    return pool


def _context_side(conn: Connection, args: argparse.Namespace, device: str) -> None:
    """The context engine's side: holds ``count`` blocks on request (socket mode), or gathers
    them into a shared-memory segment (shm mode)."""
    torch.set_num_threads(1)
    pool = _pool(args, device)
    handoffs = Handoffs(600.0)
    server = TransferServer(pool, handoffs, lambda table, transfer: None)
    segments: list[SharedMemory] = []
    while (ask := conn.recv()) is not None:
        mode, count = ask
        blocks = list(range(count))
        if mode == "socket":
            table = BlockTable(blocks=blocks, length=count * pool.tokens_per_block)
            conn.send((server.address, handoffs.hold(table, table.length)))
            continue
        data = gather_blocks(pool, blocks).cpu()
        segment = SharedMemory(create=True, size=data.numel())
        torch.frombuffer(segment.buf, dtype=torch.uint8).copy_(data)
        segments.append(segment)
        conn.send((segment.name, data.numel()))
    server.close()
    for segment in segments:
        segment.close()
        segment.unlink()


def _shm_fetch(conn: Connection, pool: KVPool, count: int) -> float:
    started = time.perf_counter()
    conn.send(("shm", count))
    name, size = conn.recv()
    segment = SharedMemory(name=name)
    try:
        data = torch.frombuffer(segment.buf, dtype=torch.uint8, count=size)
        scatter_blocks(pool, list(range(count)), data)
        del data
    finally:
        segment.close()
    return (time.perf_counter() - started) * 1000.0


def _socket_fetch(conn: Connection, pool: KVPool, count: int) -> KvTransfer:
    conn.send(("socket", count))
    address, handoff_id = conn.recv()
    return fetch_blocks(address, handoff_id, 0, pool, list(range(count)))


def _measure(args: argparse.Namespace, device: str, modes: tuple[str, ...]) -> None:
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_context_side, args=(theirs, args, device), daemon=True)
    child.start()
    pool = _pool(args, device)
    per_block = pool.layout.bytes_per_token * pool.tokens_per_block
    try:
        for count in args.block_counts:
            row: dict[str, Any] = {}
            for mode in modes:
                times = []
                for _ in range(args.repeats + 1):
                    if mode == "shm":
                        times.append(_shm_fetch(ours, pool, count))
                    else:
                        times.append(_socket_fetch(ours, pool, count).ms)
                row[mode] = statistics.median(times[1:])
            mib = count * per_block / 2**20
            cells = "  ".join(
                f"{mode} {ms:9.2f} ms ({mib / 1024 / (ms / 1000):6.2f} GiB/s)"
                for mode, ms in row.items()
            )
            print(f"{device:5} {count:5d} blocks {mib:9.1f} MiB  {cells}", flush=True)
    finally:
        ours.send(None)
        child.join(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", default="1,4,16,64", help="block counts, comma-separated")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16")
    parser.add_argument("--tokens-per-block", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-cpu", action="store_true", help="measure CUDA only")
    args = parser.parse_args()
    args.block_counts = [int(b) for b in args.blocks.split(",")]
    if not args.no_cpu:
        _measure(args, "cpu", ("socket", "shm"))
    if torch.cuda.is_available():
        _measure(args, "cuda", ("socket",))
    else:
        print("cuda: not available on this host")


if __name__ == "__main__":
    main()
