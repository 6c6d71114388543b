"""The gateway's one Redis client: RESP2 over one pipelined connection per store.

Every command is written at once and the replies come back in order (pipelined), so concurrent
admissions share the connection without a pool. Measured against redis-py 8.1 with its hiredis
parser on the tenancy bench (``python -m tests.benchmarks.tenancy --requests 4000
--redis-client resp``, then ``redis-py``, 2 cores; tests/benchmarks/results/redis-client.md): an
admission and a settlement cost 86 to 106 µs of the gateway's CPU one at a time and 60 to 70 µs
at 32 at once here, against 184 to 259 µs and 150 to 226 µs through redis-py, whose pool also
holds a connection per command in flight (p50 at 32 at once: 3.0 to 5.8 ms against 5.8 to
22.9 ms). So everything the gateway sends to Redis goes through this module: the limits'
scripts, the directory of tenants and keys (its reads a ``MULTI``/``EXEC`` batch, its writes a
script that checks the version they were decided from), and the run-time LoRA adapters' list
(``MULTI``/``EXEC`` batches, its version polled). Three ways to send:

- ``RespLink.call(*args)`` (or ``submit``, written before it returns): any command, its reply
  as Redis sends it (bulk strings as bytes, ``HGETALL`` a flat list, ``OK`` as ``b"OK"``);
- ``RespLink.transaction(*commands)``: ``MULTI``, the commands and ``EXEC`` written as one
  batch, so no other command of the connection comes between; the commands' replies;
- ``Script(link, source)(keys=..., args=...)``: a Lua script by ``EVALSHA``, sent whole by
  ``EVAL`` when Redis does not know it (redis-py's ``register_script``).

redis-py stays only as the parser of URLs and their options (``redis://``, ``rediss://``,
``unix://``, user, password and database mean what they mean to redis-py); nothing else in the
gateway imports it (tests/unit/test_architecture.py).

A connection that Redis closed (a restart, an idle timeout) is noticed when it closes and a new
one opened for the next command. A command (or a transaction) that was on a connection when it
broke, a connection that had answered before, is sent once more on a new one at once, as
redis-py's retry did.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from collections.abc import Awaitable, Sequence
from typing import Any, cast

from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url

Arg = bytes | str | int | float


class RespError(Exception):
    """An error reply of Redis (``-ERR ...``, ``-NOSCRIPT ...``)."""


class Incomplete(Exception):
    """The buffer ends inside a reply."""


def encode(args: tuple[Arg, ...]) -> bytes:
    """One command as a RESP array of bulk strings (floats as ``repr``, as redis-py sends)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, float):
            data = repr(arg).encode()
        else:
            data = str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def parse(buffer: bytes | bytearray, pos: int = 0) -> tuple[Any, int]:
    """The reply starting at ``pos`` and where the next one starts; ``Incomplete`` if the
    buffer ends first. Bulk strings are bytes, errors ``RespError`` values, nil ``None``."""
    end = buffer.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind, line, pos = buffer[pos : pos + 1], bytes(buffer[pos + 1 : end]), end + 2
    if kind == b"+":
        return line, pos
    if kind == b"-":
        return RespError(line.decode(errors="replace")), pos
    if kind == b":":
        return int(line), pos
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, pos
        if len(buffer) < pos + size + 2:
            raise Incomplete
        return bytes(buffer[pos : pos + size]), pos + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, pos
        items = []
        for _ in range(count):
            item, pos = parse(buffer, pos)
            items.append(item)
        return items, pos
    raise RespError(f"unexpected reply type {kind!r} from Redis")


def pairs(reply: list[bytes]) -> dict[bytes, bytes]:
    """A flat ``HGETALL`` (or ``CONFIG GET``) reply as the mapping it stands for."""
    return dict(zip(reply[::2], reply[1::2], strict=True))


_MORE: Any = object()
"""What ``_Partial.resume`` answers while its reply is still incomplete."""


class _Partial:
    """A reply that arrives in several reads, its arrays built element by element as the bytes
    come, so that a large reply (a directory of many keys) is parsed once, not once a read."""

    def __init__(self) -> None:
        self._open: list[tuple[list[Any], int]] = []
        """The arrays under construction, outermost first, each with its length."""

    def resume(self, buffer: bytes | bytearray, pos: int) -> tuple[Any, int]:
        """The whole reply and where the next starts, or ``_MORE`` and where to resume."""
        while True:
            try:
                value, pos = _element(buffer, pos)
            except Incomplete:
                return _MORE, pos
            if isinstance(value, _Open):
                self._open.append(([], value.count))
                continue
            while self._open:
                items, count = self._open[-1]
                items.append(value)
                if len(items) < count:
                    break
                value = self._open.pop()[0]
            else:
                return value, pos


class _Open:
    """The header of a non-empty array: its elements follow."""

    def __init__(self, count: int) -> None:
        self.count = count


def _element(buffer: bytes | bytearray, pos: int) -> tuple[Any, int]:
    """A value, or an array's header (``_Open``) without its elements."""
    if buffer[pos : pos + 1] == b"*":
        end = buffer.find(b"\r\n", pos)
        if end < 0:
            raise Incomplete
        count = int(buffer[pos + 1 : end])
        if count > 0:
            return _Open(count), end + 2
    return parse(buffer, pos)


class _Protocol(asyncio.Protocol):
    """Replies matched to the commands waiting for them, first sent first answered."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.lost: BaseException | None = None
        self.answered = False
        self._buffer = bytearray()
        self._partial: _Partial | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, though they write alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        pos = 0
        try:
            while self.waiting:
                if self._partial is None:
                    try:
                        reply, pos = parse(self._buffer, pos)
                    except Incomplete:
                        self._partial = _Partial()
                if self._partial is not None:
                    reply, pos = self._partial.resume(self._buffer, pos)
                    if reply is _MORE:
                        break
                    self._partial = None
                future = self.waiting.popleft()
                self.answered = True
                # A command whose caller gave up (a timeout) still has its reply read here.
                if not future.done():
                    future.set_result(reply)
        except (RespError, ValueError) as exc:
            self._fail(ConnectionError(f"unreadable reply from Redis: {exc}"))
            assert self.transport is not None
            self.transport.close()
        del self._buffer[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("Redis closed the connection"))

    def _fail(self, exc: BaseException) -> None:
        self.lost = exc
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(ConnectionError(str(exc)))


class RespLink:
    """One pipelined connection to the Redis of ``url``, opened at the first command."""

    def __init__(self, url: str) -> None:
        self._options: dict[str, Any] = dict(parse_url(url))
        self._protocol: _Protocol | None = None
        self._lock = asyncio.Lock()

    async def call(self, *args: Arg) -> Any:
        """Send one command and return its reply; an error reply raises ``RespError``, a broken
        connection ``ConnectionError`` (after the one retry a used connection earns)."""
        protocol = await self._ready()
        return await self._reply(protocol, self._send(protocol, args), args)

    def submit(self, *args: Arg) -> Awaitable[Any]:
        """``call``, with the command already written when this returns if the connection is
        open (else it is opened and the command sent once the result is awaited), so that
        whatever the caller does meanwhile overlaps Redis's round trip. The result must be
        awaited."""
        protocol = self._protocol
        if protocol is None or protocol.lost is not None:
            return self.call(*args)
        return self._reply(protocol, self._send(protocol, args), args)

    async def _reply(
        self, protocol: _Protocol, sent: asyncio.Future[Any], args: tuple[Arg, ...]
    ) -> Any:
        try:
            reply = await sent
        except ConnectionError:
            if not protocol.answered:
                raise
            reply = await self._send(await self._ready(), args)
        if isinstance(reply, RespError):
            raise reply
        return reply

    async def transaction(self, *commands: tuple[Arg, ...]) -> list[Any]:
        """The replies of ``commands`` run as one ``MULTI``/``EXEC`` transaction, written as one
        batch. A command Redis refuses to queue fails the whole (nothing runs); one that fails
        as it runs raises its error once the transaction is over, the others' effects kept, as
        in Redis (and as redis-py's pipelines raise)."""
        batch = (("MULTI",), *commands, ("EXEC",))
        protocol = await self._ready()
        replies = await self._gathered(self._send_all(protocol, batch))
        if any(isinstance(reply, ConnectionError) for reply in replies):
            if not protocol.answered:
                raise next(r for r in replies if isinstance(r, ConnectionError))
            replies = await self._gathered(self._send_all(await self._ready(), batch))
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        result = replies[-1]
        if not isinstance(result, list):
            raise RespError(f"transaction not run: {result!r}")
        for reply in result:
            if isinstance(reply, RespError):
                raise reply
        return result

    @staticmethod
    async def _gathered(futures: list[asyncio.Future[Any]]) -> list[Any]:
        # Every reply (or failure) taken, so none is left unretrieved when the batch breaks.
        return await asyncio.gather(*futures, return_exceptions=True)

    async def close(self) -> None:
        """Close the connection (a later command opens another)."""
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()

    @staticmethod
    def _send(protocol: _Protocol, args: tuple[Arg, ...]) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        if protocol.lost is not None or protocol.transport is None:
            future.set_exception(ConnectionError(str(protocol.lost or "not connected")))
            return future
        protocol.waiting.append(future)
        protocol.transport.write(encode(args))
        return future

    @staticmethod
    def _send_all(
        protocol: _Protocol, batch: tuple[tuple[Arg, ...], ...]
    ) -> list[asyncio.Future[Any]]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in batch]
        if protocol.lost is not None or protocol.transport is None:
            for future in futures:
                future.set_exception(ConnectionError(str(protocol.lost or "not connected")))
            return futures
        protocol.waiting.extend(futures)
        protocol.transport.write(b"".join(encode(command) for command in batch))
        return futures

    async def _ready(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.lost is None:
            return protocol
        async with self._lock:
            protocol = self._protocol
            if protocol is None or protocol.lost is not None:
                protocol = self._protocol = await self._connect()
            return protocol

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        options = self._options
        kind = options.get("connection_class")
        transport: asyncio.BaseTransport
        if kind is UnixDomainSocketConnection:
            transport, protocol = await loop.create_unix_connection(_Protocol, options["path"])
        else:
            context = _tls(options) if kind is SSLConnection else None
            host, port = options.get("host", "localhost"), int(options.get("port", 6379))
            transport, protocol = await loop.create_connection(_Protocol, host, port, ssl=context)
        try:
            await self._handshake(protocol)
        except BaseException:
            transport.close()
            raise
        return protocol

    async def _handshake(self, protocol: _Protocol) -> None:
        options = self._options
        commands: list[tuple[Arg, ...]] = []
        if options.get("password") is not None:
            user = options.get("username")
            password = options["password"]
            commands.append(("AUTH", user, password) if user else ("AUTH", password))
        if int(options.get("db", 0) or 0):
            commands.append(("SELECT", int(options["db"])))
        for reply in await asyncio.gather(*(self._send(protocol, c) for c in commands)):
            if isinstance(reply, RespError):
                raise reply
        protocol.answered = False


def _tls(options: dict[str, Any]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
    if str(options.get("ssl_cert_reqs", "required")).lower() in ("none", "cert_none"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class Script:
    """A Lua script run by its SHA1 (``EVALSHA``), sent whole once Redis does not know it."""

    def __init__(self, link: RespLink, source: str) -> None:
        self._link = link
        self._source = source
        self._sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, keys: Sequence[str] = (), args: Sequence[Arg] = ()) -> Awaitable[Any]:
        """The script's reply for ``keys`` and ``args``, its command written before this
        returns where the connection is open (``RespLink.submit``)."""
        sent = self._link.submit("EVALSHA", self._sha, len(keys), *keys, *args)
        return self._or_whole(sent, keys, args)

    async def _or_whole(
        self, sent: Awaitable[Any], keys: Sequence[str], args: Sequence[Arg]
    ) -> Any:
        try:
            return await sent
        except RespError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return await self._link.call("EVAL", self._source, len(keys), *keys, *args)
