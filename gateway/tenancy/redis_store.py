"""Limits shared by every replica through Redis: one Lua script per admission and per settlement.

Each script reads Redis's own clock, so replicas with skewed clocks agree. A tenant's keys share
the hash tag ``{tenant}``, so every script touches one Cluster slot. Concurrency leases live in a
sorted set scored by their expiry, one member per engine sequence of a request (the lease's id,
then ``id.2``, ``id.3``...): a gateway renews its leases while their requests run, so the leases
of a gateway that died expire on their own.

The scripts go over the store's pipelined connection (``gateway.tenancy.resp``), the cheapest way
a request can wait on Redis; what else the replicas share in Redis (the directory of tenants and
keys, the run-time LoRA adapters) goes over the same ``link``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any

from gateway.tenancy.config import StoreSettings, TenancyConfigError
from gateway.tenancy.quota import (
    CONCURRENCY_RETRY_S,
    Decision,
    Limit,
    Limits,
    MemoryStore,
    Quota,
    QuotaStore,
    Rejected,
    StoreUnavailable,
    quota_of,
)
from gateway.tenancy.resp import Arg, RespError, RespLink, Script

logger = logging.getLogger(__name__)

_LUA_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function store(key, tat)
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.6f', tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
  end
end
"""

# KEYS: requests, tokens, tokens_per_day buckets, leases.
# ARGV: 1-3 seconds per unit (0: no such limit), 4-6 tolerances, 7 tokens, 8 max leases (-1: no
# limit), 9 lease id, 10 lease ttl, 11 engine sequences of the lease. Replies status, failed
# bucket, retry-after, then for each bucket the units left and the seconds until it is full
# again.
ADMIT = (
    _LUA_COMMON
    + """
local costs = {1, tonumber(ARGV[7]), tonumber(ARGV[7])}
local tats = {}
local function reply(status, which, retry)
  local out = {status, tostring(which), string.format('%.6f', retry)}
  for i = 1, 3 do
    local interval = tonumber(ARGV[i])
    if interval > 0 then
      local left = (tonumber(ARGV[i + 3]) - (tats[i] - now)) / interval
      table.insert(out, string.format('%.6f', math.max(0, left)))
      table.insert(out, string.format('%.6f', tats[i] - now))
    else
      table.insert(out, '-1')
      table.insert(out, '0')
    end
  end
  return out
end
for i = 1, 3 do
  if tonumber(ARGV[i]) > 0 then
    tats[i] = math.max(tonumber(redis.call('GET', KEYS[i]) or '0'), now)
  end
end
for i = 1, 3 do
  local interval = tonumber(ARGV[i])
  if interval > 0 then
    local wanted = tats[i] + costs[i] * interval
    local tolerance = tonumber(ARGV[i + 3])
    if wanted - now > tolerance + 1e-9 then
      return reply('limit', i, wanted - tolerance - now)
    end
  end
end
local most = tonumber(ARGV[8])
local width = tonumber(ARGV[11])
if most >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  if redis.call('ZCARD', KEYS[4]) + width > most then
    return reply('concurrency', 4, 0)
  end
end
for i = 1, 3 do
  local interval = tonumber(ARGV[i])
  if interval > 0 then
    tats[i] = tats[i] + costs[i] * interval
    store(KEYS[i], tats[i])
  end
end
if most >= 0 then
  local ttl = tonumber(ARGV[10])
  redis.call('ZADD', KEYS[4], now + ttl, ARGV[9])
  for i = 2, width do
    redis.call('ZADD', KEYS[4], now + ttl, ARGV[9] .. '.' .. i)
  end
  redis.call('PEXPIRE', KEYS[4], math.ceil(ttl * 2000))
end
return reply('ok', 0, 0)
"""
)

# KEYS: tokens, tokens_per_day buckets, leases. ARGV: 1-2 seconds per token (0: none),
# 3 tokens to give back (negative: to charge), 4 lease id, 5 engine sequences of the lease.
SETTLE = (
    _LUA_COMMON
    + """
local units = tonumber(ARGV[3])
for i = 1, 2 do
  local interval = tonumber(ARGV[i])
  if interval > 0 then
    local tat = math.max(tonumber(redis.call('GET', KEYS[i]) or '0'), now)
    store(KEYS[i], math.max(tat - units * interval, now))
  end
end
redis.call('ZREM', KEYS[3], ARGV[4])
for i = 2, tonumber(ARGV[5]) do
  redis.call('ZREM', KEYS[3], ARGV[4] .. '.' .. i)
end
return 1
"""
)

# KEYS: leases. ARGV: ttl, then the lease ids this gateway still holds.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i])
end
if #ARGV > 1 then
  redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1]) * 2000))
end
return 1
"""

_FAILURES = (RespError, OSError, TimeoutError)


def _args(limit: Limit | None) -> tuple[float, float]:
    return (limit.interval, limit.tolerance) if limit is not None else (0.0, 0.0)


class RedisStore:
    """Limits shared by every gateway pointed at one Redis."""

    def __init__(
        self,
        link: RespLink,
        *,
        prefix: str = "tgw",
        timeout_s: float = 0.25,
        lease_ttl_s: float = 30.0,
    ) -> None:
        self.link = link
        """The connection, for what else the replicas share in Redis."""
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._lease_ttl_s = lease_ttl_s
        self._admit = Script(link, ADMIT)
        self._settle = Script(link, SETTLE)
        self._renew = Script(link, RENEW)
        self._held: dict[str, dict[str, int]] = {}
        """Per tenant, the leases this gateway holds and the sequences of each."""
        self._renewer: asyncio.Task[None] | None = None

    @classmethod
    def connect(cls, url: str, **options: Any) -> RedisStore:
        """A store over a new connection to ``url`` (opened on first use).

        A connection that Redis closed (a restart, an idle timeout) fails its next command;
        that command is sent once more on a fresh connection, at once, so only a Redis that
        stays unreachable counts as an outage.
        """
        return cls(RespLink(url), **options)

    def keys(self, tenant: str) -> list[str]:
        """The tenant's keys: its three buckets and its leases, all in slot ``{tenant}``."""
        base = f"{self._prefix}:{{{tenant}}}"
        return [f"{base}:requests", f"{base}:tokens", f"{base}:tokens_per_day", f"{base}:leases"]

    def admit(
        self, tenant: str, limits: Limits, tokens: int, lease: str, sequences: int = 1
    ) -> Awaitable[Quota]:
        """One script: check every limit and the leases, then take from all or from none. Its
        command is on its way when this returns (the connection open), so the caller's work
        until it awaits the quota overlaps Redis's round trip."""
        (requests, requests_tol), (tpm, tpm_tol), (tpd, tpd_tol) = (
            _args(limits.requests),
            _args(limits.tokens),
            _args(limits.daily_tokens),
        )
        most = -1 if limits.concurrency is None else limits.concurrency
        args: list[Arg] = [requests, tpm, tpd, requests_tol, tpm_tol, tpd_tol, tokens, most, lease]
        sent = self._admit(keys=self.keys(tenant), args=[*args, self._lease_ttl_s, sequences])
        return self._admitted(tenant, limits, lease, sequences, sent)

    async def _admitted(
        self, tenant: str, limits: Limits, lease: str, sequences: int, sent: Awaitable[Any]
    ) -> Quota:
        reply = await self._wait(sent)
        status, which, retry, *rest = (
            v.decode() if isinstance(v, bytes) else str(v) for v in reply
        )
        decisions = self._decisions(limits, [float(v) for v in rest], allowed=status == "ok")
        quota = quota_of(limits, decisions)
        if status == "ok":
            if limits.concurrency is not None:
                self._hold(tenant, lease, sequences)
            return quota
        if status == "concurrency":
            raise Rejected("concurrency", CONCURRENCY_RETRY_S, quota)
        failed = [limits.requests, limits.tokens, limits.daily_tokens][int(which) - 1]
        raise Rejected(failed.name if failed else "requests", float(retry), quota)

    async def settle(self, tenant: str, limits: Limits, refund: int, lease: str) -> None:
        """One script: give back unused tokens and remove the lease."""
        sequences = self._release(tenant, lease)
        keys = self.keys(tenant)
        args = [_args(limits.tokens)[0], _args(limits.daily_tokens)[0], refund, lease, sequences]
        await self._call(self._settle, [keys[1], keys[2], keys[3]], args)

    async def close(self) -> None:
        """Stop renewing leases and close the connection."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        await self.link.close()

    @staticmethod
    def _decisions(limits: Limits, values: list[float], *, allowed: bool) -> dict[str, Decision]:
        decisions = {}
        for index, limit in enumerate((limits.requests, limits.tokens, limits.daily_tokens)):
            if limit is not None:
                left, reset = values[2 * index], values[2 * index + 1]
                decisions[limit.name] = Decision(allowed, 0.0, 0.0, left, reset)
        return decisions

    async def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        return await self._wait(script(keys=keys, args=args))

    async def _wait(self, sent: Awaitable[Any]) -> Any:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await sent
        except _FAILURES as exc:
            raise StoreUnavailable(f"redis: {exc!r}") from exc

    def _hold(self, tenant: str, lease: str, sequences: int) -> None:
        self._held.setdefault(tenant, {})[lease] = sequences
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())

    def _release(self, tenant: str, lease: str) -> int:
        """Stop renewing the lease; the sequences it held (1 for one this gateway never held)."""
        held = self._held.get(tenant)
        if held is None:
            return 1
        sequences = held.pop(lease, 1)
        if not held:
            del self._held[tenant]
        return sequences

    async def _renew_forever(self) -> None:
        """Push the expiry of every lease this gateway holds, a third of the TTL at a time."""
        while self._held:
            await asyncio.sleep(self._lease_ttl_s / 3)
            for tenant, leases in list(self._held.items()):
                if not leases:
                    continue
                members = [
                    f"{lease}.{i}" if i > 1 else lease
                    for lease, sequences in list(leases.items())
                    for i in range(1, sequences + 1)
                ]
                try:
                    await self._call(
                        self._renew, [self.keys(tenant)[3]], [self._lease_ttl_s, *members]
                    )
                except StoreUnavailable as exc:
                    logger.debug("renewing the leases of %s failed: %s", tenant, exc)


def open_store(settings: StoreSettings) -> tuple[QuotaStore, RespLink | None]:
    """The store ``settings`` name, and its Redis connection (None for this process's memory)."""
    if settings.kind == "embedded":
        raise TenancyConfigError(
            "tenancy.store.kind: embedded is a redis-server that triton-gateway serve "
            "starts; an app built by other means names a Redis (kind: redis) instead"
        )
    if settings.kind != "redis":
        return MemoryStore(), None
    store = RedisStore.connect(
        settings.url,
        prefix=settings.prefix,
        timeout_s=settings.timeout_s,
        lease_ttl_s=settings.lease_ttl_s,
    )
    return store, store.link
