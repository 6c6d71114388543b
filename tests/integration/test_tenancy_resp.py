"""The tenancy store's own Redis connection against a real redis-server: replies matched to
their commands however many are in flight, a caller that gave up never handed another's reply,
scripts sent whole when Redis forgot them, passwords, databases and Unix sockets as in redis-py's
URLs, and a connection Redis dropped mid-command."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tenancy import resp
from gateway.tenancy.resp import Incomplete, RespError, RespLink, Script, encode, pairs, parse
from tests.support.redis_server import RedisServer


@pytest.fixture(scope="module")
def locked_server() -> Iterator[RedisServer]:
    server = RedisServer(password="s3cret-pass").start()
    yield server
    server.stop()


def _key() -> str:
    return f"test-resp-{uuid.uuid4().hex[:8]}"


async def test_concurrent_commands_each_get_their_own_reply(redis_server: RedisServer) -> None:
    link = RespLink(redis_server.url)
    keys = [_key() for _ in range(50)]
    await asyncio.gather(*(link.call("SET", key, index) for index, key in enumerate(keys)))
    values = await asyncio.gather(*(link.call("GET", key) for key in keys))
    assert values == [str(index).encode() for index in range(50)]
    assert await link.call("INCRBY", keys[3], 10) == 13
    assert await link.call("GET", _key()) is None
    await link.close()


async def test_a_caller_that_gave_up_never_gets_anothers_reply(redis_server: RedisServer) -> None:
    link = RespLink(redis_server.url)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await link.call("BLPOP", _key(), 0.3)
    # The next command is answered with its own reply, not the late nil of BLPOP.
    assert await link.call("ECHO", "mine") == b"mine"
    await asyncio.sleep(0.4)
    assert await link.call("ECHO", "still mine") == b"still mine"
    await link.close()


async def test_error_replies_raise_and_leave_the_connection_usable(
    redis_server: RedisServer,
) -> None:
    link = RespLink(redis_server.url)
    key = _key()
    await link.call("SET", key, "text")
    with pytest.raises(RespError, match="not an integer"):
        await link.call("INCR", key)
    assert await link.call("GET", key) == b"text"
    await link.close()


async def test_a_script_redis_forgot_is_sent_whole(redis_server: RedisServer) -> None:
    link = RespLink(redis_server.url)
    script = Script(link, "return {KEYS[1], tonumber(ARGV[1]) * 2, ARGV[2]}")
    key = _key()
    await link.call("SCRIPT", "FLUSH")
    assert await script([key], [21, 0.5]) == [key.encode(), 42, b"0.5"]
    # Now Redis knows it: the same reply by its SHA1 alone.
    assert await script([key], [4, "x"]) == [key.encode(), 8, b"x"]
    with pytest.raises(RespError, match=r"compil|syntax|Error"):
        await Script(link, "return error_here(")([key], [])
    await link.close()


async def test_password_and_database_come_from_the_url(locked_server: RedisServer) -> None:
    url = locked_server.url.removesuffix("/0") + "/3"
    link = RespLink(url)
    key = _key()
    await link.call("SET", key, "in three")
    await link.close()
    client = aioredis.from_url(url)
    assert await client.get(key) == b"in three"
    await client.aclose()
    other = aioredis.from_url(locked_server.url)
    assert await other.get(key) is None
    await other.aclose()


async def test_a_wrong_or_missing_password_is_an_error_reply(
    locked_server: RedisServer,
) -> None:
    wrong = locked_server.url.replace("s3cret-pass", "wrong")
    with pytest.raises(RespError, match=r"WRONGPASS|invalid"):
        await RespLink(wrong).call("PING")
    with pytest.raises(RespError, match="NOAUTH"):
        await RespLink(f"redis://127.0.0.1:{locked_server.port}/0").call("PING")


async def test_unix_socket_urls(locked_server: RedisServer) -> None:
    link = RespLink(f"unix://:{locked_server.password}@{locked_server.socket}?db=2")
    assert await link.call("PING") == b"PONG"
    assert await link.call("CLIENT", "INFO") != b""
    assert b"db=2" in await link.call("CLIENT", "INFO")
    await link.close()


async def test_a_connection_redis_dropped_mid_command_is_retried_once() -> None:
    server = RedisServer().start()
    link = RespLink(server.url)
    try:
        await link.call("PING")
        killer = RespLink(server.url)
        # Redis closes the link's connection (as an idle timeout would) while it is in use.
        (client_id,) = [await link.call("CLIENT", "ID")]
        blocked = asyncio.ensure_future(link.call("BLPOP", _key(), 2))
        await asyncio.sleep(0.1)
        assert await killer.call("CLIENT", "KILL", "ID", client_id) == 1
        # Sent once more on a new connection: the BLPOP runs to its own timeout there.
        assert await blocked is None
        await killer.close()
    finally:
        await link.close()
        server.stop()


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.one_of(st.binary(max_size=40), st.integers(-(2**62), 2**62), st.none()),
        lambda inner: st.lists(inner, max_size=5),
        max_leaves=20,
    ),
    st.integers(1, 7),
)
def test_replies_parse_whole_however_they_are_cut(value: object, cut: int) -> None:
    def wire(item: object) -> bytes:
        if item is None:
            return b"$-1\r\n"
        if isinstance(item, int):
            return b":%d\r\n" % item
        if isinstance(item, bytes):
            return b"$%d\r\n%s\r\n" % (len(item), item)
        assert isinstance(item, list)
        return b"*%d\r\n" % len(item) + b"".join(wire(part) for part in item)

    data = wire(value) + b"+OK\r\n"
    assert parse(data) == (value, len(data) - 5)
    assert parse(data, len(data) - 5) == (b"OK", len(data))
    with pytest.raises(Incomplete):
        parse(data[: max(0, len(data) - 5 - cut)])


def test_commands_are_arrays_of_bulk_strings() -> None:
    assert encode(("SET", b"k\r\n", 3, 0.25)) == (
        b"*4\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$1\r\n3\r\n$4\r\n0.25\r\n"
    )
    assert parse(b"-NOSCRIPT No matching script\r\n")[0].args == ("NOSCRIPT No matching script",)


async def test_a_transaction_runs_whole_and_answers_each_command(
    redis_server: RedisServer,
) -> None:
    link = RespLink(redis_server.url)
    counter, table = _key(), _key()
    assert await link.transaction(
        ("INCR", counter), ("HSET", table, "a", "1", "b", "2"), ("GET", counter)
    ) == [1, 2, b"1"]
    assert pairs(await link.call("HGETALL", table)) == {b"a": b"1", b"b": b"2"}
    # A command Redis will not queue: nothing of the transaction runs.
    with pytest.raises(RespError, match="wrong number of arguments"):
        await link.transaction(("INCR", counter), ("GET",))
    assert await link.call("GET", counter) == b"1"
    # A command that fails as it runs: its error raises, the others ran, as in Redis.
    with pytest.raises(RespError, match="WRONGTYPE"):
        await link.transaction(("INCR", counter), ("INCR", table))
    assert await link.call("GET", counter) == b"2"
    # Commands sent meanwhile by other callers on the connection are answered as their own.
    replies = await asyncio.gather(
        *(link.transaction(("INCR", counter), ("ECHO", str(i))) for i in range(20)),
        *(link.call("ECHO", f"call {i}") for i in range(20)),
    )
    assert [r[1] for r in replies[:20]] == [str(i).encode() for i in range(20)]
    assert sorted(r[0] for r in replies[:20]) == list(range(3, 23))
    assert replies[20:] == [f"call {i}".encode() for i in range(20)]
    await link.close()


async def test_a_transaction_on_a_connection_redis_dropped_is_sent_again() -> None:
    server = RedisServer().start()
    link = RespLink(server.url)
    try:
        key = _key()
        await link.call("PING")
        server.kill()
        server.start()
        # The connection the restart closed was one that had answered: sent again on a new one.
        assert await link.transaction(("INCR", key), ("INCR", key)) == [1, 2]
    finally:
        await link.close()
        server.stop()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=30), max_size=60), st.integers(1, 40))
def test_a_reply_read_in_pieces_is_the_reply_sent(items: list[bytes], piece: int) -> None:
    wire = b"*%d\r\n" % len(items) + b"".join(b"$%d\r\n%s\r\n" % (len(i), i) for i in items)
    loop = asyncio.new_event_loop()
    try:
        protocol = resp._Protocol()
        replies = [loop.create_future() for _ in range(2)]
        protocol.waiting.extend(replies)
        for start in range(0, len(wire) + 5, piece):
            protocol.data_received((wire + b":7\r\n")[start : start + piece])
        assert [reply.result() for reply in replies] == [items, 7]
    finally:
        loop.close()


def test_a_large_reply_read_in_pieces_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read parses on from where the last stopped, so a directory of many keys costs the
    gateway in proportion to its size, not to its size times the reads it arrives in."""
    items = [b"%d" % i * 20 for i in range(2000)]
    wire = b"*%d\r\n" % len(items) + b"".join(b"$%d\r\n%s\r\n" % (len(i), i) for i in items)
    calls = 0
    whole = resp.parse

    def counted(buffer: bytes | bytearray, pos: int = 0) -> tuple[object, int]:
        nonlocal calls
        calls += 1
        return whole(buffer, pos)

    monkeypatch.setattr(resp, "parse", counted)
    loop = asyncio.new_event_loop()
    try:
        protocol = resp._Protocol()
        reply = loop.create_future()
        protocol.waiting.append(reply)
        for start in range(0, len(wire), 1024):
            protocol.data_received(wire[start : start + 1024])
        assert reply.result() == items
    finally:
        loop.close()
    # One parse of each element, one retried for each read that ended inside it, and the
    # first attempt at the whole.
    assert calls <= len(items) + 2 * (len(wire) // 1024 + 1)
