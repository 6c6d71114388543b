"""Random ids and seeds from the kernel's random bytes, without a system call for each.

A request takes several: its request id, the answer's id, the generation's id, its admission's
lease and its sampling seed. Each ``os.urandom`` is a system call on the request's way to Triton:
0.4 µs on a plain kernel, more where a sandbox serves a process's system calls (gVisor). Here
they are cut from a buffer of the kernel's random bytes, refilled a few kilobytes at a time:
every byte comes from ``os.urandom`` and is handed out once, so the ids are as unpredictable as
``secrets.token_hex``'s. A forked child starts with an empty buffer: no two processes hand out
the same bytes.
"""

from __future__ import annotations

import os
import random
import threading

_REFILL = 4096
"""Bytes read from the kernel at a time."""


class _RandomBytes:
    """The buffer: ``take(n)`` hands out its next ``n`` bytes, refilling it when short."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = b""
        self._at = 0

    def take(self, n: int) -> bytes:
        with self._lock:
            at = self._at
            if at + n > len(self._bytes):
                self._bytes, at = os.urandom(max(_REFILL, n)), 0
            self._at = at + n
            return self._bytes[at : at + n]

    def forget(self) -> None:
        """Drop what the parent had left (and its lock, which a parent's thread may hold)."""
        self._lock = threading.Lock()
        self._bytes = b""
        self._at = 0


_random_bytes = _RandomBytes()
os.register_at_fork(after_in_child=_random_bytes.forget)


def random_hex(nbytes: int) -> str:
    """``nbytes`` random bytes as hexadecimal, as ``secrets.token_hex(nbytes)``."""
    return _random_bytes.take(nbytes).hex()


class BufferedRandom(random.SystemRandom):
    """``random.SystemRandom`` drawing on the buffer: the kernel's random bytes, fewer calls."""

    def random(self) -> float:
        return (int.from_bytes(_random_bytes.take(7)) >> 3) * 2.0**-53

    def getrandbits(self, k: int) -> int:
        if k < 0:
            raise ValueError("number of bits must be non-negative")
        return int.from_bytes(_random_bytes.take((k + 7) // 8)) >> (-k % 8)

    def randbytes(self, n: int) -> bytes:
        return _random_bytes.take(n)


rng = BufferedRandom()
"""The one ``BufferedRandom`` of the gateway (it keeps no state of its own)."""
