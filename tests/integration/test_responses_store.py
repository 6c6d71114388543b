"""Stored responses in a real Redis: each tenant's own, held to the bound by the script that
stores them, every record expiring with the time to live."""

from __future__ import annotations

import asyncio

from gateway.tenancy.config import ResponseStoreSettings
from gateway.tenancy.resp import RespLink
from gateway.tenancy.responses_store import RedisResponses
from tests.support.redis_server import RedisServer


async def test_redis_keeps_each_tenants_own_within_the_bound_and_ttl(
    redis_server: RedisServer,
) -> None:
    client = RespLink(redis_server.url)
    settings = ResponseStoreSettings(ttl_s=600, max_per_tenant=3)
    store = RedisResponses(client, settings, prefix="resp-test")
    # Stored at once by several workers: the bound still holds.
    await asyncio.gather(*(store.put("a", f"r{i}", b"x%d" % i) for i in range(8)))
    await store.put("b", "r0", b"other")
    kept = await store.ids("a")
    assert len(kept) == 3
    assert [await store.get("a", f"r{i}") is not None for i in range(8)].count(True) == 3
    assert await store.get("b", "r0") == b"other"
    assert await store.ids("b") == ["r0"]
    others = [found for found in kept if found != "r0"]
    assert [await store.get("b", found) for found in others] == [None] * len(others)
    ttl = await client.call("PTTL", f"resp-test:{{a}}:responses:record:{kept[-1]}")
    assert 0 < ttl <= 600_000
    assert await store.delete("a", kept[-1])
    assert not await store.delete("a", kept[-1])
    assert await store.ids("a") == kept[:-1]
    await client.close()


async def test_redis_keeps_a_tenants_bytes_within_its_bound(redis_server: RedisServer) -> None:
    client = RespLink(redis_server.url)
    settings = ResponseStoreSettings(ttl_s=600, max_bytes_per_tenant=10)
    store = RedisResponses(client, settings, prefix="resp-bytes")
    for name in ("r1", "r2", "r3"):
        await store.put("a", name, b"1234")
    assert await store.ids("a") == ["r2", "r3"]
    assert await store.get("a", "r1") is None
    await store.put("a", "big", b"x" * 50)  # the newest stays, alone, whatever its size
    assert await store.ids("a") == ["big"]
    assert await store.delete("a", "big")
    await store.put("a", "r4", b"1234")
    await store.put("a", "r5", b"1234")
    assert await store.ids("a") == ["r4", "r5"]  # the deleted one's bytes no longer count
    assert await store.get("a", "sizes") is None  # no id reaches the store's own keys
    await client.close()
