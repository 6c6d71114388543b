"""Who the tenants are and which keys open them: the settings file's, and those changed at run time.

With the Redis store, the admin API writes tenants, keys, revocations and deletions to Redis and
bumps a version number; every replica polls that number and reloads on a change, so a revoked
key is locked out everywhere within the polling period. How the run-time state and the settings
file combine is ``gateway.tenancy.state``'s rule. Each change is one optimistic transaction
(WATCH on the version, MULTI/EXEC) computed from the state it replaces, so two replicas patching
one tenant at once never lose either change. The directory's keys share the hash tag
``{directory}``, so each transaction stays in one Cluster slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError, WatchError

from gateway.tenancy.config import KeyEntry, TenancySettings, TenantPolicy, check_policy
from gateway.tenancy.state import RunTimeChanges, Snapshot, differences, in_force

logger = logging.getLogger(__name__)


class DirectoryReadOnly(Exception):
    """Run-time changes need the Redis store."""


@dataclass(frozen=True, slots=True)
class Change:
    """What one admin call writes to Redis."""

    put: tuple[TenantPolicy, ...] = ()
    deleted: tuple[str, ...] = ()
    added: tuple[KeyEntry, ...] = ()
    revoked: tuple[KeyEntry, ...] = ()


ChangeDecision = Callable[[Snapshot], Change | None]
"""Decides a change from the state in force; ``None`` when there is nothing to change."""


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
        self.snapshot = in_force(settings)
        self._version: bytes | str | None = None
        self._reported = False
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
        try:
            await self.refresh()
        except (RedisError, OSError, TimeoutError) as exc:
            logger.warning(
                "could not read the run-time tenants and keys from redis (%s); the settings "
                "file's are in force until it answers",
                exc,
            )
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
        changes = RunTimeChanges(
            tenants={
                policy.name: policy
                for policy in (msgspec.json.decode(v, type=TenantPolicy) for v in tenants.values())
            },
            keys=tuple(msgspec.json.decode(v, type=KeyEntry) for v in keys.values()),
            revoked=frozenset(v.decode() for v in revoked),
            deleted=frozenset(v.decode() for v in deleted),
        )
        self.snapshot = in_force(self._settings, changes)
        self._version = version
        if not self._reported:
            self._reported = True
            self._report(changes)

    async def put_tenant(self, policy: TenantPolicy) -> None:
        """Create or replace a tenant."""
        check_policy(policy)
        await self._apply(lambda _: Change(put=(policy,)))

    async def update_tenant(
        self, name: str, edit: Callable[[TenantPolicy], TenantPolicy]
    ) -> TenantPolicy | None:
        """Replace the tenant called ``name`` with ``edit`` of its policy in force, atomically;
        None if there is no such tenant."""

        def decide(snapshot: Snapshot) -> Change | None:
            current = snapshot.tenants.get(name)
            return None if current is None else Change(put=(edit(current),))

        change = await self._apply(decide)
        return None if change is None else change.put[0]

    async def delete_tenant(self, name: str) -> bool:
        """Remove a tenant and revoke its keys; False if there is none."""

        def decide(snapshot: Snapshot) -> Change | None:
            if name not in snapshot.tenants:
                return None
            keys = tuple(k for k in snapshot.keys.entries() if k.tenant == name)
            return Change(deleted=(name,), revoked=keys)

        return await self._apply(decide) is not None

    async def add_key(self, entry: KeyEntry) -> bool:
        """Store a new key's digest; False if its tenant does not exist."""

        def decide(snapshot: Snapshot) -> Change | None:
            return Change(added=(entry,)) if entry.tenant in snapshot.tenants else None

        return await self._apply(decide) is not None

    async def revoke(self, key_id: str) -> KeyEntry | None:
        """Revoke the key whose id (or full digest) is ``key_id``; None if there is none."""

        def decide(snapshot: Snapshot) -> Change | None:
            entries = snapshot.keys.entries()
            entry = next((k for k in entries if key_id in (k.key_id, k.sha256)), None)
            return None if entry is None else Change(revoked=(entry,))

        change = await self._apply(decide)
        return None if change is None else change.revoked[0]

    def tenants(self) -> list[TenantPolicy]:
        """Every tenant, by name."""
        return [self.snapshot.tenants[name] for name in sorted(self.snapshot.tenants)]

    def key_entries(self) -> list[KeyEntry]:
        """Every key that opens something."""
        return sorted(self.snapshot.keys.entries(), key=lambda k: (k.tenant, k.name, k.key_id))

    async def _apply(self, decide: ChangeDecision) -> Change | None:
        """Decide a change from the state in force and write it, unless another change came
        in between (then decide again)."""
        client = self._require()
        async with asyncio.timeout(self._timeout_s * 4), client.pipeline() as pipe:
            while True:
                await pipe.watch(self._version_key)
                await self.refresh(force=True)
                change = decide(self.snapshot)
                if change is None:
                    return None
                pipe.multi()  # type: ignore[no-untyped-call]
                self._write(pipe, change)
                try:
                    await pipe.execute()
                except WatchError:
                    continue
                break
        await self.refresh(force=True)
        return change

    def _write(self, pipe: aioredis.client.Pipeline, change: Change) -> None:
        for policy in change.put:
            pipe.hset(self._tenants_key, policy.name, msgspec.json.encode(policy))
            pipe.srem(self._deleted_key, policy.name)
        for name in change.deleted:
            pipe.hdel(self._tenants_key, name)
            pipe.sadd(self._deleted_key, name)
        for entry in change.added:
            pipe.hset(self._keys_key, entry.sha256, msgspec.json.encode(entry))
        for entry in change.revoked:
            pipe.hdel(self._keys_key, entry.sha256)
            pipe.sadd(self._revoked_key, entry.sha256)
        pipe.incr(self._version_key)

    def _report(self, changes: RunTimeChanges) -> None:
        """Log once what the run-time state changes from the settings file."""
        settings = self._settings
        logger.info(
            "tenancy: %d tenant(s) and %d key(s) in force (the settings file has %d and %d; "
            "run-time changes in redis win for the tenants and keys they touch)",
            len(self.snapshot.tenants),
            len(self.snapshot.keys),
            len(settings.tenants),
            len(settings.keys),
        )
        for line in differences(settings, changes):
            logger.warning("run-time state differs from the settings file: %s", line)

    def _require(self) -> aioredis.Redis:
        if self._client is None:
            raise DirectoryReadOnly(
                "tenants and keys change at run time only with a Redis store, and this "
                "gateway counts in memory: remove tenancy.store.kind: memory from the settings "
                "file (triton-gateway serve then runs the embedded store, kept in tenancy.rdb "
                "beside the file), or set tenancy.store.kind: embedded or kind: redis with its "
                "url, and restart; with kind: memory, edit the settings file instead"
            )
        return self._client

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh()
            except (RedisError, OSError, TimeoutError) as exc:
                logger.debug("reading tenants and keys from redis failed: %s", exc)
