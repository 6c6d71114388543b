"""The KV-cache handoff between engines in different processes: a context engine's transfer
server gives a held request's blocks to the generation engine that asks, over a local socket.

On the CPU the blocks' bytes cross the socket from one pool into the other (one gather on the
sending side, one scatter on the receiving side; ``tests/benchmarks/disagg_transfer.py``
measures it against a shared-memory segment). Between CUDA pools only a CUDA IPC handle of the
gathered blocks crosses it: the receiver copies device to device and says when it is done.

Protocol: the client sends one JSON line ``{"handoff_id", "skip", "cuda_ipc"}``; the server
answers one JSON line (``{"ok": false, "error"}``, or ``{"ok": true, "blocks", "bytes",
"mode"}`` with the IPC handle's fields in ``cuda_ipc`` mode), then the bytes in ``bytes`` mode,
or waits for the client's ``{"done": true}`` line in ``cuda_ipc`` mode.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from deploy.triton.engine.blocks import BlockTable, blocks_for
from deploy.triton.engine.disagg.phase import BadContextPhase, KvTransfer
from deploy.triton.engine.kvcache import KVPool

logger = logging.getLogger(__name__)

_SCHEME = "unix-abstract:"
_CONNECT_TIMEOUT_S = 10.0
_IO_TIMEOUT_S = 60.0
_HEADER_LIMIT = 1 << 16


def slots_of(pool: KVPool, blocks: Sequence[int]) -> torch.Tensor:
    """The pool slots of ``blocks``, block after block."""
    size = pool.tokens_per_block
    index = torch.tensor(list(blocks), dtype=torch.long, device=pool.device)
    offsets = torch.arange(size, device=pool.device)
    return (index.unsqueeze(1) * size + offsets).reshape(-1)


def gather_blocks(pool: KVPool, blocks: Sequence[int]) -> torch.Tensor:
    """Every layer's keys then values of ``blocks``: one flat byte tensor on the pool's device."""
    slots = slots_of(pool, blocks)
    parts = [t.index_select(0, slots).reshape(-1) for t in (*pool.keys, *pool.values)]
    return torch.cat(parts).view(torch.uint8)


def scatter_blocks(pool: KVPool, blocks: Sequence[int], data: torch.Tensor) -> None:
    """Write ``data`` (as ``gather_blocks`` made it, on any device) into ``blocks`` of ``pool``."""
    slots = slots_of(pool, blocks)
    flat = data.to(pool.device, non_blocking=True).view(pool.layout.dtype)
    start = 0
    for layer in (*pool.keys, *pool.values):
        count = slots.numel() * layer.shape[1] * layer.shape[2]
        part = flat[start : start + count].view(slots.numel(), layer.shape[1], layer.shape[2])
        layer.index_copy_(0, slots, part)
        start += count


@dataclass
class _Held:
    table: BlockTable
    prompt_length: int
    deadline: float
    request_id: str = ""


class Handoffs:
    """Requests a context engine holds for a generation engine to take, each until it is taken
    or its deadline passes. Taking and expiring are thread-safe; only one of them wins."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}

    def hold(self, table: BlockTable, prompt_length: int, request_id: str = "") -> str:
        """Hold ``table`` of the engine's request ``request_id`` under a new unguessable id."""
        handoff_id = secrets.token_hex(16)
        deadline = time.monotonic() + self.timeout_s
        with self._lock:
            self._held[handoff_id] = _Held(table, prompt_length, deadline, request_id)
        return handoff_id

    def take(self, handoff_id: str) -> _Held | None:
        """The held request of ``handoff_id``, now no longer held; None if unknown or gone."""
        with self._lock:
            return self._held.pop(handoff_id, None)

    def drop(self, request_id: str) -> list[BlockTable]:
        """The tables held for the engine's request ``request_id``, no longer held (its client
        stopped it before a generation engine took them)."""
        with self._lock:
            gone = [key for key, held in self._held.items() if held.request_id == request_id]
            return [self._held.pop(key).table for key in gone]

    def expired(self) -> list[BlockTable]:
        """The tables whose deadline passed, no longer held."""
        now = time.monotonic()
        with self._lock:
            gone = [key for key, held in self._held.items() if held.deadline <= now]
            return [self._held.pop(key).table for key in gone]

    def next_deadline_s(self) -> float | None:
        """Seconds until the next deadline; None when nothing is held."""
        with self._lock:
            if not self._held:
                return None
            return max(0.0, min(h.deadline for h in self._held.values()) - time.monotonic())


def _read_line(conn: socket.socket) -> dict[str, object]:
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
        if len(data) > _HEADER_LIMIT:
            raise ConnectionError("header too long")
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ConnectionError("header is not an object")
    return value


def _send_line(conn: socket.socket, value: dict[str, object]) -> None:
    conn.sendall(json.dumps(value).encode() + b"\n")


def _share_cuda(data: torch.Tensor) -> dict[str, object]:
    """The fields of a CUDA IPC handle of ``data`` (as ``torch.multiprocessing`` shares it),
    in JSON: no pickle crosses the socket."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(data)
    names = (
        "device",
        "handle",
        "storage_size_bytes",
        "storage_offset_bytes",
        "requires_grad",
        "ref_counter_handle",
        "ref_counter_offset",
        "event_handle",
        "event_sync_required",
    )
    fields = dict(zip(names, args[6:], strict=True))
    fields["numel"] = data.numel()
    fields["offset"] = int(args[3])
    return {k: v.hex() if isinstance(v, bytes) else v for k, v in fields.items()}


def _open_cuda(fields: dict[str, object]) -> torch.Tensor:
    """The byte tensor a peer shared with ``_share_cuda``."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    def raw(name: str) -> bytes:
        return bytes.fromhex(str(fields[name]))

    return rebuild_cuda_tensor(
        torch.Tensor,
        torch.Size([int(str(fields["numel"]))]),
        (1,),
        int(str(fields["offset"])),
        torch.storage.TypedStorage,
        torch.uint8,
        int(str(fields["device"])),
        raw("handle"),
        int(str(fields["storage_size_bytes"])),
        int(str(fields["storage_offset_bytes"])),
        False,
        raw("ref_counter_handle"),
        int(str(fields["ref_counter_offset"])),
        raw("event_handle"),
        bool(fields["event_sync_required"]),
    )


class TransferServer:
    """Serves a context engine's held requests from its pool, one connection per handoff.

    ``on_taken`` gets each table once its blocks are sent (the engine thread releases it);
    it is called on the server's threads."""

    def __init__(
        self,
        pool: KVPool,
        handoffs: Handoffs,
        on_taken: Callable[[BlockTable, KvTransfer], None],
    ) -> None:
        self.pool = pool
        self.handoffs = handoffs
        self.on_taken = on_taken
        name = f"trtllm-kv-{os.getpid()}-{secrets.token_hex(8)}"
        self.address = _SCHEME + name
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.bind("\0" + name)
        self._socket.listen(64)
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="kv-transfer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting handoffs."""
        self._closed = True
        self._socket.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(_IO_TIMEOUT_S)
            try:
                self._handoff(conn)
            except Exception:
                logger.warning("a KV-cache handoff failed", exc_info=True)

    def _handoff(self, conn: socket.socket) -> None:
        ask = _read_line(conn)
        held = self.handoffs.take(str(ask.get("handoff_id", "")))
        if held is None:
            _send_line(conn, {"ok": False, "error": "unknown"})
            return
        started = time.perf_counter()
        transfer = KvTransfer(0, 0, 0.0)
        try:
            blocks = held.table.blocks[: blocks_for(held.prompt_length, self.pool.tokens_per_block)]
            skip = int(str(ask.get("skip", 0)))
            if not 0 <= skip <= len(blocks):
                _send_line(conn, {"ok": False, "error": f"skip {skip} of {len(blocks)} blocks"})
                return
            wanted = blocks[skip:]
            if not wanted:
                _send_line(conn, {"ok": True, "blocks": 0, "bytes": 0, "mode": "bytes"})
                return
            data = gather_blocks(self.pool, wanted)
            header: dict[str, object] = {"ok": True, "blocks": len(wanted), "bytes": data.numel()}
            if data.is_cuda and ask.get("cuda_ipc"):
                torch.cuda.current_stream(data.device).synchronize()
                _send_line(conn, header | {"mode": "cuda_ipc"} | _share_cuda(data))
                _read_line(conn)
            else:
                _send_line(conn, header | {"mode": "bytes"})
                conn.sendall(memoryview(data.cpu().numpy()))
            elapsed = (time.perf_counter() - started) * 1000.0
            transfer = KvTransfer(len(wanted), data.numel(), elapsed)
        finally:
            self.on_taken(held.table, transfer)


def connect(address: str) -> socket.socket:
    """A connection to a transfer server, or the reason there is none."""
    if not address.startswith(_SCHEME):
        raise BadContextPhase(f"context_phase_params names an unknown address {address!r}")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(_CONNECT_TIMEOUT_S)
    try:
        conn.connect("\0" + address[len(_SCHEME) :])
    except OSError as exc:
        conn.close()
        raise BadContextPhase(
            f"the context engine at {address} cannot be reached ({exc}): it is gone, or on "
            "another host"
        ) from exc
    conn.settimeout(_IO_TIMEOUT_S)
    return conn


def fetch_blocks(
    address: str, handoff_id: str, skip: int, pool: KVPool, blocks: Sequence[int]
) -> KvTransfer:
    """Take a held request's blocks from ``skip`` on into ``blocks`` of ``pool``."""
    started = time.perf_counter()
    with connect(address) as conn:
        _send_line(
            conn, {"handoff_id": handoff_id, "skip": skip, "cuda_ipc": pool.device.type == "cuda"}
        )
        header = _read_line(conn)
        if not header.get("ok"):
            reason = header.get("error")
            if reason == "unknown":
                raise BadContextPhase(
                    f"the context engine at {address} holds no request {handoff_id}: it was "
                    "taken already, or freed after its kv_transfer_timeout_ms"
                )
            raise BadContextPhase(f"the context engine refused the handoff: {reason}")
        count = int(str(header["blocks"]))
        size = int(str(header["bytes"]))
        if count != len(blocks):
            raise BadContextPhase(f"the context engine sent {count} blocks for {len(blocks)}")
        if count:
            if header.get("mode") == "cuda_ipc":
                data = _open_cuda(header)
                scatter_blocks(pool, blocks, data)
                torch.cuda.current_stream(pool.device).synchronize()
                del data
                _send_line(conn, {"done": True})
            else:
                scatter_blocks(pool, blocks, _receive(conn, size, pool.device))
    return KvTransfer(count, size, (time.perf_counter() - started) * 1000.0)


def _receive(conn: socket.socket, size: int, device: torch.device) -> torch.Tensor:
    """``size`` bytes from ``conn`` into a byte tensor (pinned where it goes on to CUDA)."""
    data = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
    view = memoryview(data.numpy())
    received = 0
    while received < size:
        count = conn.recv_into(view[received:])
        if count == 0:
            raise BadContextPhase("the context engine closed the handoff before all blocks came")
        received += count
    return data
