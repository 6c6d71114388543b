"""The HPACK header blocks of gRPC calls: a call's request headers written without an encoder's
table, and the server's blocks decoded once for as long as its table stays as it was.

Kept for speed: on 2 shared cores (``python -m tests.benchmarks.grpc_headers``) hpack's
``Encoder`` took 8.1 µs of CPU for a call's request headers and its ``Decoder`` 5.2 µs for a
later call's response headers and trailers; a block written here takes 1.2 µs and a decoded
block found again 0.25 µs for both. Triton's gRPC frontend sends the same indexed blocks for
every call's response headers and every successful call's trailers, so only a connection's
first blocks, and those that add to its table (a failed call's message), are decoded.

A request's headers are sent as literals without indexing (RFC 7541, 6.2.2), their names the
static table's where it has them: the same bytes whatever either table holds, so the constant
part of a path's headers is built once per connection. The block after a change of the server's
``SETTINGS_HEADER_TABLE_SIZE`` starts with a dynamic table size update to 0, which every limit
allows, as this side never adds to the server's table.
"""

from __future__ import annotations

from collections.abc import Mapping

import hpack

_METHOD_POST, _SCHEME_HTTP = 3, 6
"""Static-table entries (RFC 7541, appendix A) sent as they are."""
_AUTHORITY, _PATH, _CONTENT_TYPE = 1, 4, 31
"""Static-table names given new values."""
_TABLE_SIZE_ZERO = b"\x20"
_CACHED_BLOCKS = 64
"""Decoded blocks kept per connection: Triton's calls end with a handful of different ones."""


def _integer(value: int, prefix_bits: int, flags: int = 0) -> bytes:
    """An HPACK integer (RFC 7541, 5.1) with ``flags`` in the bits above its prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((flags | value,))
    out = [flags | limit]
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(raw: bytes) -> bytes:
    """A string literal, not Huffman-coded."""
    return _integer(len(raw), 7) + raw


def literal(name: str | int, value: str) -> bytes:
    """A header field as a literal without indexing: a new name, or a static-table name's
    index."""
    if isinstance(name, int):
        return _integer(name, 4) + _string(value.encode())
    return b"\x00" + _string(name.encode()) + _string(value.encode())


def grpc_timeout(seconds: float) -> str:
    """``grpc-timeout``: at most 8 digits, in the finest unit that holds them."""
    micros = max(int(seconds * 1_000_000), 1)
    if micros < 100_000_000:
        return f"{micros}u"
    millis = micros // 1000
    return f"{millis}m" if millis < 100_000_000 else f"{millis // 1000}S"


class RequestHeaders:
    """The header blocks of one connection's calls: what every call to a path sends, built once,
    then each call's deadline and metadata."""

    def __init__(self, authority: str) -> None:
        self._authority = authority
        self._constant: dict[str, bytes] = {}
        self._resized = False

    def table_resized(self) -> None:
        """The server set its ``SETTINGS_HEADER_TABLE_SIZE``: the next block says this side's
        table is empty."""
        self._resized = True

    def block(self, path: str, timeout: float, metadata: Mapping[str, str]) -> bytes:
        """The header block of a call to ``path``."""
        constant = self._constant.get(path)
        if constant is None:
            constant = self._constant[path] = b"".join(
                (
                    _integer(_METHOD_POST, 7, 0x80),
                    _integer(_SCHEME_HTTP, 7, 0x80),
                    literal(_PATH, path),
                    literal(_AUTHORITY, self._authority),
                    literal(_CONTENT_TYPE, "application/grpc"),
                    literal("te", "trailers"),
                )
            )
        parts = [constant, literal("grpc-timeout", grpc_timeout(timeout))]
        parts.extend(literal(name.lower(), value) for name, value in metadata.items())
        if self._resized:
            self._resized = False
            parts.insert(0, _TABLE_SIZE_ZERO)
        return b"".join(parts)


class ResponseHeaders:
    """The server's header blocks decoded: a block that left the decoder's table as it was (its
    fields indexed, or literals not indexed) decodes the same while the table stays so, and is
    kept; one that changed the table drops what was kept."""

    def __init__(self) -> None:
        self._decoder = hpack.Decoder()
        self._decoded: dict[bytes, dict[bytes, bytes]] = {}

    def decode(self, block: bytes) -> Mapping[bytes, bytes]:
        """A block's fields (a field repeated keeps its last value); read them, never change
        them: a kept block's mapping is handed out again."""
        headers = self._decoded.get(block)
        if headers is not None:
            return headers
        table = self._decoder.header_table
        entries = table.dynamic_entries
        # An entry added is a new object at the table's front; one evicted changes its length.
        size, count, front = table.maxsize, len(entries), entries[0] if entries else None
        headers = dict(self._decoder.decode(block, raw=True))
        unchanged = (
            table.maxsize == size
            and len(entries) == count
            and (entries[0] if entries else None) is front
        )
        if not unchanged:
            self._decoded.clear()
        elif len(self._decoded) < _CACHED_BLOCKS:
            self._decoded[block] = headers
        return headers
