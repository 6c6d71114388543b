"""The directory of tenants and keys over a real redis-server, as two replicas share it: a change
written through one is read by the other, and changes made at once through both are all kept."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest

from gateway.tenancy.config import KeyEntry, TenancySettings, TenantPolicy
from gateway.tenancy.directory import Directory
from gateway.tenancy.resp import RespLink
from gateway.tenancy.service import digest, new_key
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

FILE = TenancySettings(tenants=(TenantPolicy(name="base"),))


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[tuple[Directory, Directory]]:
    """Two directories of one prefix, each over its own connection, as two replicas hold them."""
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    links = [RespLink(redis_server.url) for _ in range(2)]
    one, two = (Directory(FILE, link, prefix=prefix, timeout_s=5.0) for link in links)
    await one.refresh()
    await two.refresh()
    yield one, two
    for link in links:
        await link.close()


async def test_a_change_through_one_replica_is_read_by_the_other(
    replicas: tuple[Directory, Directory],
) -> None:
    one, two = replicas
    key = new_key()
    await one.put_tenant(TenantPolicy(name="team", requests_per_minute=60))
    assert await one.add_key(KeyEntry(tenant="team", sha256=digest(key), name="ci"))
    await two.refresh()
    found = two.snapshot.keys.get(digest(key))
    assert found is not None and found.name == "ci"
    tenant = two.tenant(found.tenant)
    assert tenant is not None and tenant.requests_per_minute == 60

    revoked = await two.revoke(found.key_id)
    assert revoked is not None and revoked.sha256 == digest(key)
    await one.refresh()
    assert digest(key) not in one.snapshot.keys
    assert await one.delete_tenant("base")
    await two.refresh()
    assert [t.name for t in two.tenants()] == ["team"]
    # A deleted tenant put again is back, for both.
    await two.put_tenant(TenantPolicy(name="base"))
    await one.refresh()
    assert [t.name for t in one.tenants()] == ["base", "team"]


async def test_changes_made_at_once_through_two_replicas_are_all_kept(
    replicas: tuple[Directory, Directory],
) -> None:
    """Each change reads the tenant and writes it back one higher: every one of them counts,
    however they interleave, because a write decided from a state that moved is decided again."""
    one, two = replicas

    def one_more(policy: TenantPolicy) -> TenantPolicy:
        return msgspec.structs.replace(policy, max_concurrency=(policy.max_concurrency or 0) + 1)

    await asyncio.gather(
        *(directory.update_tenant("base", one_more) for directory in (one, two) * 12)
    )
    await one.refresh()
    await two.refresh()
    assert one.snapshot.tenants["base"].max_concurrency == 24
    assert two.snapshot.tenants["base"].max_concurrency == 24
