"""Stored responses (``POST /v1/responses`` with ``store``), kept per tenant with a time to live
and a bound on how many one tenant keeps: in this process, or in the tenancy store's Redis so
that every worker and replica continues a conversation.

A record is opaque bytes here (the Responses room encodes it); a tenant reaches only its own:
the tenant's name is part of every key, and there is no lookup by id alone.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Protocol

from gateway.errors import ServiceUnavailableError
from gateway.tenancy.config import ResponseStoreSettings
from gateway.tenancy.resp import RespError, RespLink, Script


class ResponseStore(Protocol):
    """Where stored responses live, by tenant and response id."""

    async def put(self, tenant: str, response_id: str, record: bytes) -> None:
        """Keep ``record``, forgetting the tenant's oldest beyond the bound."""
        ...

    async def get(self, tenant: str, response_id: str) -> bytes | None:
        """The tenant's record, or None (never made, expired, deleted or another's)."""
        ...

    async def delete(self, tenant: str, response_id: str) -> bool:
        """Forget the tenant's record; whether there was one."""
        ...

    async def ids(self, tenant: str) -> list[str]:
        """The ids the tenant keeps now, oldest first."""
        ...


class MemoryResponses:
    """Stored responses of one process."""

    def __init__(
        self, settings: ResponseStoreSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._kept: dict[str, OrderedDict[str, tuple[float, bytes]]] = {}
        """Per tenant, in the order they were made: each record with its expiry."""

    def _live(self, tenant: str) -> OrderedDict[str, tuple[float, bytes]]:
        kept = self._kept.setdefault(tenant, OrderedDict())
        now = self._clock()
        while kept:
            oldest, (expires, _) = next(iter(kept.items()))
            if expires > now:
                break
            del kept[oldest]
        return kept

    async def put(self, tenant: str, response_id: str, record: bytes) -> None:
        kept = self._live(tenant)
        kept.pop(response_id, None)
        kept[response_id] = (self._clock() + self._settings.ttl_s, record)
        held = sum(len(found) for _, found in kept.values())
        while len(kept) > 1 and (
            len(kept) > self._settings.max_per_tenant or held > self._settings.max_bytes_per_tenant
        ):
            _, (_, oldest) = kept.popitem(last=False)
            held -= len(oldest)

    async def get(self, tenant: str, response_id: str) -> bytes | None:
        found = self._live(tenant).get(response_id)
        return None if found is None else found[1]

    async def delete(self, tenant: str, response_id: str) -> bool:
        return self._live(tenant).pop(response_id, None) is not None

    async def ids(self, tenant: str) -> list[str]:
        return list(self._live(tenant))


# KEYS: the tenant's index (a sorted set of ids by the time they were made, in ms, times 1000
# plus the order of storing within one), the sizes of its records (a hash) and the counter of
# that order. ARGV: 1 the prefix of record keys, 2 id, 3 record, 4 ttl in ms, 5 most
# records kept, 6 most bytes kept. The newest record is kept whatever its size.
_PUT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[4])
local oldest_kept = (now - ttl) * 1000
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', oldest_kept)) do
  redis.call('HDEL', KEYS[2], old)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', oldest_kept)
redis.call('SET', ARGV[1] .. ARGV[2], ARGV[3], 'PX', ttl)
-- Milliseconds, then the order of storing within one: oldest first, never by id.
local order = redis.call('INCR', KEYS[3]) % 1000
redis.call('ZADD', KEYS[1], now * 1000 + order, ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], string.len(ARGV[3]))
local held = 0
for _, size in ipairs(redis.call('HVALS', KEYS[2])) do held = held + tonumber(size) end
local count = redis.call('ZCARD', KEYS[1])
while count > 1 and (count > tonumber(ARGV[5]) or held > tonumber(ARGV[6])) do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  held = held - tonumber(redis.call('HGET', KEYS[2], oldest) or '0')
  redis.call('DEL', ARGV[1] .. oldest)
  redis.call('HDEL', KEYS[2], oldest)
  redis.call('ZREM', KEYS[1], oldest)
  count = count - 1
end
for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, ttl) end
"""
# KEYS: the index and the sizes. ARGV: the ttl in ms. Forgets the ids whose records expired,
# then lists.
_IDS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', (now - ttl) * 1000)) do
  redis.call('HDEL', KEYS[2], old)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', (now - ttl) * 1000)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""


class RedisResponses:
    """Stored responses in the tenancy store's Redis, shared by every worker and replica.

    Each record is a key of its own that Redis expires; the tenant's index (a sorted set by
    time made) and the sizes of its records enforce the bounds in the same script that stores,
    so workers storing at once never keep more than the bounds. Every key of a tenant shares
    the hash tag ``{tenant}``.
    """

    def __init__(self, link: RespLink, settings: ResponseStoreSettings, *, prefix: str) -> None:
        self._link = link
        self._settings = settings
        self._prefix = prefix
        self._put = Script(link, _PUT)
        self._ids = Script(link, _IDS)

    def _base(self, tenant: str) -> str:
        return f"{self._prefix}:{{{tenant}}}:responses"

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self._settings.ttl_s * 1000))

    async def put(self, tenant: str, response_id: str, record: bytes) -> None:
        base = self._base(tenant)
        args: list[bytes | str | int | float] = [
            f"{base}:record:",
            response_id,
            record,
            self._ttl_ms,
            self._settings.max_per_tenant,
            self._settings.max_bytes_per_tenant,
        ]
        with _reachable():
            await self._put(keys=[base, f"{base}:sizes", f"{base}:order"], args=args)

    async def get(self, tenant: str, response_id: str) -> bytes | None:
        with _reachable():
            found = await self._link.call("GET", f"{self._base(tenant)}:record:{response_id}")
        return found if isinstance(found, bytes) or found is None else str(found).encode()

    async def delete(self, tenant: str, response_id: str) -> bool:
        base = self._base(tenant)
        with _reachable():
            deleted, *_ = await self._link.transaction(
                ("DEL", f"{base}:record:{response_id}"),
                ("ZREM", base, response_id),
                ("HDEL", f"{base}:sizes", response_id),
            )
        return bool(deleted)

    async def ids(self, tenant: str) -> list[str]:
        with _reachable():
            base = self._base(tenant)
            found = await self._ids(keys=[base, f"{base}:sizes"], args=[self._ttl_ms])
        return [item.decode() if isinstance(item, bytes) else str(item) for item in found]


@contextlib.contextmanager
def _reachable() -> Iterator[None]:
    """Redis failures as a 503: a stored conversation can be neither read nor kept without it."""
    try:
        yield
    except (RespError, OSError) as exc:
        raise ServiceUnavailableError(
            "The store of responses is unreachable; try again shortly.",
            code="store_unavailable",
        ) from exc


def response_store(
    settings: ResponseStoreSettings, link: RespLink | None, *, prefix: str
) -> ResponseStore:
    """The tenancy store's kind of response store: Redis where the limits are in Redis."""
    if link is None:
        return MemoryResponses(settings)
    return RedisResponses(link, settings, prefix=prefix)
