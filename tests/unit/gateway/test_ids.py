"""Random ids and seeds cut from a buffer of the kernel's random bytes."""

from __future__ import annotations

import os
import string

import pytest

from gateway import ids
from gateway.ids import BufferedRandom, random_hex


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What ``os.urandom`` returned to the buffer, from an empty buffer on."""
    returned: list[bytes] = []
    real = os.urandom

    def urandom(n: int) -> bytes:
        returned.append(real(n))
        return returned[-1]

    monkeypatch.setattr(ids, "_random_bytes", ids._RandomBytes())
    monkeypatch.setattr(ids.os, "urandom", urandom)
    return returned


def test_ids_are_the_kernels_bytes_each_handed_out_once(kernel: list[bytes]) -> None:
    taken = [random_hex(16) for _ in range(1000)]
    # 16,000 bytes from a few reads, not a read an id.
    assert len(kernel) == 4
    assert all(len(value) == 32 and set(value) <= set(string.hexdigits) for value in taken)
    # In order, each block's ids are its bytes from the start, without a byte twice; what a
    # block has left when the next id does not fit is dropped.
    handed = b"".join(bytes.fromhex(value) for value in taken)
    blocks = b"".join(block[: len(block) - len(block) % 16] for block in kernel)
    assert handed == blocks[: len(handed)]
    assert len(set(taken)) == len(taken)


def test_a_request_longer_than_the_buffer_is_read_whole(kernel: list[bytes]) -> None:
    value = random_hex(5000)
    assert bytes.fromhex(value) == kernel[-1]
    assert len(kernel[-1]) == 5000


def test_a_forked_child_does_not_hand_out_its_parents_next_bytes() -> None:
    random_hex(16)  # the buffer holds bytes the parent has not handed out yet
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(write, random_hex(16).encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(child, 0)
    childs = os.read(read, 64).decode()
    os.close(read)
    assert status == 0
    assert childs != random_hex(16)


def test_buffered_random_draws_in_range(kernel: list[bytes]) -> None:
    rng = BufferedRandom()
    bits = [rng.getrandbits(63) for _ in range(2000)]
    assert all(0 <= value < 2**63 for value in bits)
    assert max(bits) >= 2**62  # the top bit is drawn too
    assert rng.getrandbits(0) == 0
    assert all(0 <= rng.getrandbits(5) < 32 for _ in range(500))
    floats = [rng.random() for _ in range(2000)]
    assert all(0.0 <= value < 1.0 for value in floats)
    assert 0.4 < sum(floats) / len(floats) < 0.6
    assert len(rng.randbytes(10)) == 10
    assert {rng.choice("ab") for _ in range(100)} == {"a", "b"}
    with pytest.raises(ValueError):
        rng.getrandbits(-1)
    # 2,000 seeds, 2,000 floats and the rest in a few reads of the kernel.
    assert len(kernel) <= 8
