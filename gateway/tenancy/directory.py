"""Who the tenants are and which keys open them: the settings file's, and those changed at run time.

With the Redis store, the admin API writes tenants, keys, revocations and deletions to Redis and
bumps a version number; every replica polls that number and reloads on a change, so a revoked
key is locked out everywhere within the polling period. How the run-time state and the settings
file combine is ``gateway.tenancy.state``'s rule. The state is read with its version in one
``MULTI``/``EXEC``; each change is computed from the state it replaces and written by one script
that first checks that the version is still the one read (else the change is decided again), so
two replicas patching one tenant at once never lose either change. The directory's keys share
the hash tag ``{directory}``, so each read and each write stays in one Cluster slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from gateway.tenancy.config import KeyEntry, TenancySettings, TenantPolicy, check_policy
from gateway.tenancy.resp import Arg, RespError, RespLink, Script, pairs
from gateway.tenancy.state import RunTimeChanges, Snapshot, differences, in_force

logger = logging.getLogger(__name__)

# KEYS: version, tenants, keys, revoked, deleted. ARGV: the version the change was decided from
# ('' for none), then each part as its count and its items: tenants put (name, policy), tenants
# deleted (name), keys added (digest, entry), keys revoked (digest). Replies 0, writing nothing,
# when the version moved since.
WRITE = """
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then
  return 0
end
local at = 1
local function take()
  at = at + 1
  return ARGV[at]
end
for _ = 1, tonumber(take()) do
  local name = take()
  redis.call('HSET', KEYS[2], name, take())
  redis.call('SREM', KEYS[5], name)
end
for _ = 1, tonumber(take()) do
  local name = take()
  redis.call('HDEL', KEYS[2], name)
  redis.call('SADD', KEYS[5], name)
end
for _ = 1, tonumber(take()) do
  local digest = take()
  redis.call('HSET', KEYS[3], digest, take())
end
for _ = 1, tonumber(take()) do
  local digest = take()
  redis.call('HDEL', KEYS[3], digest)
  redis.call('SADD', KEYS[4], digest)
end
redis.call('INCR', KEYS[1])
return 1
"""

_FAILURES = (RespError, OSError, TimeoutError)


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
        link: RespLink | None = None,
        *,
        prefix: str = "tgw",
        refresh_s: float = 0.25,
        timeout_s: float = 0.25,
    ) -> None:
        self._settings = settings
        self._link = link
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        base = f"{prefix}:{{directory}}"
        self._tenants_key, self._keys_key = f"{base}:tenants", f"{base}:keys"
        self._revoked_key, self._deleted_key = f"{base}:revoked", f"{base}:deleted"
        self._version_key = f"{base}:version"
        self.snapshot = in_force(settings)
        self._version: bytes | None = None
        """The version the snapshot was read at (None before the first read, or none set)."""
        self._reported = False
        self._poller: asyncio.Task[None] | None = None

    @property
    def shared(self) -> bool:
        """Whether run-time changes are possible (and shared by every replica)."""
        return self._link is not None

    def describe(self) -> str:
        """One line for the start-up banner: auth, and the tenants and keys in force."""
        settings = self._settings
        if not settings.auth:
            return "auth: OFF (tenancy.auth: false) - anyone who reaches this port may use it"
        admin = "on" if settings.admin_key_sha256 is not None else "off"
        # ``auto`` counts in memory here: ``triton-gateway serve`` resolves it before building
        # the app, so the line names what runs rather than what was written.
        store = "redis" if self.shared else "memory, tenants and keys from the file"
        return (
            f"auth: on, {len(self.snapshot.tenants)} tenant(s) and {len(self.snapshot.keys)} "
            f"key(s) in force, limits in {store}, admin API {admin}"
        )

    def tenant(self, name: str) -> TenantPolicy | None:
        """The tenant called ``name``."""
        return self.snapshot.tenants.get(name)

    async def start(self) -> None:
        """Load the run-time state once, then keep polling for changes."""
        if self._link is None:
            return
        try:
            await self.refresh()
        except _FAILURES as exc:
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
        link = self._require()
        async with asyncio.timeout(self._timeout_s * 4):
            if not force and await link.call("GET", self._version_key) == self._version:
                return
            version, tenants, keys, revoked, deleted = await link.transaction(
                ("GET", self._version_key),
                ("HGETALL", self._tenants_key),
                ("HGETALL", self._keys_key),
                ("SMEMBERS", self._revoked_key),
                ("SMEMBERS", self._deleted_key),
            )
        changes = RunTimeChanges(
            tenants={
                policy.name: policy
                for policy in (
                    msgspec.json.decode(v, type=TenantPolicy) for v in pairs(tenants).values()
                )
            },
            keys=tuple(msgspec.json.decode(v, type=KeyEntry) for v in pairs(keys).values()),
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
            keys = tuple(k for k in snapshot.keys.values() if k.tenant == name)
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
            entries = snapshot.keys.values()
            entry = next((k for k in entries if key_id in (k.key_id, k.sha256)), None)
            return None if entry is None else Change(revoked=(entry,))

        change = await self._apply(decide)
        return None if change is None else change.revoked[0]

    def tenants(self) -> list[TenantPolicy]:
        """Every tenant, by name."""
        return [self.snapshot.tenants[name] for name in sorted(self.snapshot.tenants)]

    def key_entries(self) -> list[KeyEntry]:
        """Every key that opens something."""
        return sorted(self.snapshot.keys.values(), key=lambda k: (k.tenant, k.name, k.key_id))

    async def _apply(self, decide: ChangeDecision) -> Change | None:
        """Decide a change from the state in force and write it, unless another change came
        in between (then decide again)."""
        write = Script(self._require(), WRITE)
        keys = (
            self._version_key,
            self._tenants_key,
            self._keys_key,
            self._revoked_key,
            self._deleted_key,
        )
        async with asyncio.timeout(self._timeout_s * 4):
            while True:
                await self.refresh(force=True)
                version, change = self._version, decide(self.snapshot)
                if change is None:
                    return None
                if await write(keys=keys, args=[version or b"", *_written(change)]):
                    break
        await self.refresh(force=True)
        return change

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

    def _require(self) -> RespLink:
        if self._link is None:
            raise DirectoryReadOnly(
                "tenants and keys change at run time only with a Redis store, and this "
                "gateway counts in memory: remove tenancy.store.kind: memory from the settings "
                "file (triton-gateway serve then runs the embedded store, kept in tenancy.rdb "
                "beside the file), or set tenancy.store.kind: embedded or kind: redis with its "
                "url, and restart; with kind: memory, edit the settings file instead"
            )
        return self._link

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh()
            except _FAILURES as exc:
                logger.debug("reading tenants and keys from redis failed: %s", exc)


def _written(change: Change) -> list[Arg]:
    """The change as ``WRITE``'s arguments after the version."""
    args: list[Arg] = [len(change.put)]
    for policy in change.put:
        args += [policy.name, msgspec.json.encode(policy)]
    args.append(len(change.deleted))
    args += change.deleted
    args.append(len(change.added))
    for entry in change.added:
        args += [entry.sha256, msgspec.json.encode(entry)]
    args.append(len(change.revoked))
    args += [entry.sha256 for entry in change.revoked]
    return args
