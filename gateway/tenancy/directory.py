"""Who the tenants are and which keys open them: the configuration's, and those changed at run time.

With the Redis store, the admin API writes tenants, keys and revocations to Redis and bumps a
version number; every replica polls that number and reloads on a change, so a revoked key is
locked out everywhere within the polling period. The directory's keys share the hash tag
``{directory}``, so each change is one MULTI/EXEC in one Cluster slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.tenancy.config import KeyEntry, TenancySettings, TenantPolicy, check_policy
from gateway.tenancy.keys import KeyRing

logger = logging.getLogger(__name__)


class DirectoryReadOnly(Exception):
    """Run-time changes need the Redis store."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Tenants by name and the keys that open them, as of one moment."""

    tenants: dict[str, TenantPolicy]
    keys: KeyRing


def _merge(
    settings: TenancySettings,
    tenants: Iterable[TenantPolicy] = (),
    keys: Iterable[KeyEntry] = (),
    revoked: Iterable[str] = (),
    deleted: Iterable[str] = (),
) -> Snapshot:
    gone, revoked_keys = set(deleted), set(revoked)
    merged = {t.name: t for t in settings.tenants if t.name not in gone}
    merged.update({t.name: t for t in tenants})
    entries = [k for k in (*settings.keys, *keys) if k.sha256 not in revoked_keys]
    return Snapshot(merged, KeyRing(entries))


class Directory:
    """Tenants and keys; read from memory on every request, refreshed from Redis if shared."""

    def __init__(
        self,
        settings: TenancySettings,
        client: aioredis.Redis | None = None,
        *,
        prefix: str = "tgw",
        refresh_s: float = 0.25,
        timeout_s: float = 0.25,
    ) -> None:
        self._settings = settings
        self._client = client
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        base = f"{prefix}:{{directory}}"
        self._tenants_key, self._keys_key = f"{base}:tenants", f"{base}:keys"
        self._revoked_key, self._deleted_key = f"{base}:revoked", f"{base}:deleted"
        self._version_key = f"{base}:version"
        self.snapshot = _merge(settings)
        self._version: bytes | str | None = None
        self._poller: asyncio.Task[None] | None = None

    @property
    def shared(self) -> bool:
        """Whether run-time changes are possible (and shared by every replica)."""
        return self._client is not None

    def tenant(self, name: str) -> TenantPolicy | None:
        """The tenant called ``name``."""
        return self.snapshot.tenants.get(name)

    def find(self, key: str) -> tuple[KeyEntry, TenantPolicy] | None:
        """The entry and tenant of a presented key, if it opens one."""
        entry = self.snapshot.keys.find(key)
        if entry is None:
            return None
        tenant = self.snapshot.tenants.get(entry.tenant)
        return None if tenant is None else (entry, tenant)

    async def start(self) -> None:
        """Load the run-time state once, then keep polling for changes."""
        if self._client is None:
            return
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            await self.refresh()
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def close(self) -> None:
        """Stop polling."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller

    async def refresh(self, *, force: bool = False) -> None:
        """Reload from Redis when its version changed since the last load."""
        client = self._require()
        async with asyncio.timeout(self._timeout_s * 4):
            version = await client.get(self._version_key)
            if version == self._version and not force:
                return
            async with client.pipeline(transaction=True) as pipe:
                pipe.hgetall(self._tenants_key)
                pipe.hgetall(self._keys_key)
                pipe.smembers(self._revoked_key)
                pipe.smembers(self._deleted_key)
                tenants, keys, revoked, deleted = await pipe.execute()
        self.snapshot = _merge(
            self._settings,
            (msgspec.json.decode(v, type=TenantPolicy) for v in tenants.values()),
            (msgspec.json.decode(v, type=KeyEntry) for v in keys.values()),
            (v.decode() for v in revoked),
            (v.decode() for v in deleted),
        )
        self._version = version

    async def put_tenant(self, policy: TenantPolicy) -> None:
        """Create or replace a tenant."""
        check_policy(policy)
        await self._change(
            lambda pipe: (
                pipe.hset(self._tenants_key, policy.name, msgspec.json.encode(policy)),
                pipe.srem(self._deleted_key, policy.name),
            )
        )

    async def delete_tenant(self, name: str) -> bool:
        """Remove a tenant (its keys then open nothing); False if there is none."""
        if name not in self.snapshot.tenants:
            return False
        await self._change(
            lambda pipe: (pipe.hdel(self._tenants_key, name), pipe.sadd(self._deleted_key, name))
        )
        return True

    async def add_key(self, entry: KeyEntry) -> None:
        """Store a new key's digest."""
        await self._change(
            lambda pipe: (pipe.hset(self._keys_key, entry.sha256, msgspec.json.encode(entry)),)
        )

    async def revoke(self, key_id: str) -> KeyEntry | None:
        """Revoke the key whose id (or full digest) is ``key_id``; None if there is none."""
        entry = next((k for k in self.key_entries() if key_id in (k.key_id, k.sha256)), None)
        if entry is not None:
            await self._change(
                lambda pipe: (
                    pipe.hdel(self._keys_key, entry.sha256),
                    pipe.sadd(self._revoked_key, entry.sha256),
                )
            )
        return entry

    def tenants(self) -> list[TenantPolicy]:
        """Every tenant, by name."""
        return [self.snapshot.tenants[name] for name in sorted(self.snapshot.tenants)]

    def key_entries(self) -> list[KeyEntry]:
        """Every key that opens something."""
        return sorted(self.snapshot.keys.entries(), key=lambda k: (k.tenant, k.name, k.key_id))

    async def _change(self, write: object) -> None:
        client = self._require()
        async with asyncio.timeout(self._timeout_s * 4):
            async with client.pipeline(transaction=True) as pipe:
                write(pipe)  # type: ignore[operator]
                pipe.incr(self._version_key)
                await pipe.execute()
        await self.refresh(force=True)

    def _require(self) -> aioredis.Redis:
        if self._client is None:
            raise DirectoryReadOnly(
                "tenants and keys change at run time only with the Redis store "
                "(tenancy.store.kind: redis); with the memory store, edit the configuration"
            )
        return self._client

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh()
            except (RedisError, OSError, TimeoutError) as exc:
                logger.debug("reading tenants and keys from redis failed: %s", exc)
