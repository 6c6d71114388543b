"""Attained service shared by every gateway process through the tenancy store's Redis.

Each process keeps its own slots and queue; what it shares is each tenant's decayed attained
service per model, one hash in Redis. A dispatch is charged to the local ledger at once (no
Redis on the request path); a background loop sends the charges made since its last round and
reads back every tenant's standing, every ``sync_interval_s`` while there are charges to send or
requests waiting. So a process orders its queue by the whole gateway's service, late by at most
one interval and a round trip: one script call per model per interval and process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.queueing.scheduler import Ledger
from gateway.tenancy.resp import RespError, RespLink, Script

logger = logging.getLogger(__name__)

# KEYS[1]: the model's hash (tenant -> standing, tenant@ -> when). ARGV[1]: the half-life,
# ARGV[2]: the hash's ttl in seconds, then tenant and charge pairs. Returns every tenant and its
# standing decayed to Redis's clock now.
_SYNC = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local half = tonumber(ARGV[1])
local function decayed(value, at)
  return tonumber(value or '0') * math.pow(2, -(now - tonumber(at or now)) / half)
end
for i = 3, #ARGV, 2 do
  local held = redis.call('HMGET', KEYS[1], ARGV[i], ARGV[i] .. '@')
  local value = math.max(decayed(held[1], held[2]) + tonumber(ARGV[i + 1]), 0)
  redis.call('HSET', KEYS[1], ARGV[i], string.format('%.17g', value),
             ARGV[i] .. '@', string.format('%.6f', now))
end
local all = redis.call('HGETALL', KEYS[1])
local fields = {}
for i = 1, #all, 2 do fields[all[i]] = all[i + 1] end
local out = {}
for name, value in pairs(fields) do
  if string.sub(name, -1) ~= '@' then
    table.insert(out, name)
    table.insert(out, string.format('%.17g', decayed(value, fields[name .. '@'])))
  end
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return out
"""
_TTL_HALF_LIVES = 20
"""A hash nobody charged for this many half-lives holds nothing that still counts."""


class SharedLedger(Ledger):
    """A ledger whose standings are the whole gateway's, synchronised through Redis."""

    def __init__(
        self,
        half_life_s: float,
        epoch: float,
        link: RespLink,
        key: str,
        clock: Callable[[], float],
    ) -> None:
        super().__init__(half_life_s, epoch)
        self._script = Script(link, _SYNC)
        self.key = key
        self.clock = clock
        self.pending: dict[str, float] = {}
        """Charges made here and not sent yet."""

    def charge(self, tenant: str, cost: float, now: float) -> None:
        super().charge(tenant, cost, now)
        self.pending[tenant] = self.pending.get(tenant, 0.0) + cost

    async def sync(self) -> None:
        """Send the pending charges; take every tenant's standing from Redis."""
        sent, self.pending = self.pending, {}
        args: list[Any] = [self.half_life_s, int(self.half_life_s * _TTL_HALF_LIVES) + 1]
        for tenant, cost in sent.items():
            args += [tenant, repr(cost)]
        try:
            reply = await self._script(keys=[self.key], args=args)
        except BaseException:
            for tenant, cost in sent.items():
                self.pending[tenant] = self.pending.get(tenant, 0.0) + cost
            raise
        scale = self.scale(self.clock())
        sums = {
            _text(reply[i]): float(_text(reply[i + 1])) * scale for i in range(0, len(reply), 2)
        }
        # Charged while the call was on its way: kept until the next round sends them.
        for tenant, cost in self.pending.items():
            sums[tenant] = max(sums.get(tenant, 0.0) + cost * scale, 0.0)
        self.sums = sums

    async def run(self, interval_s: float, busy: Callable[[], bool]) -> None:
        """Synchronise every ``interval_s`` while there is something to send or requests
        wait; an unreachable Redis leaves the local standings in use until it is back."""
        failing = False
        while True:
            await asyncio.sleep(interval_s)
            if not self.pending and not busy():
                continue
            try:
                await self.sync()
            except (RespError, OSError) as exc:
                if not failing:
                    logger.warning("fair queue %s: shared standings unavailable: %r", self.key, exc)
                failing = True
            else:
                failing = False


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def shared_ledgers(
    link: RespLink, prefix: str, half_life_s: float, clock: Callable[[], float] = time.monotonic
) -> Callable[[str], SharedLedger]:
    """A shared ledger for each model, in the hash ``<prefix>:fairq:<model>``."""
    return lambda model: SharedLedger(
        half_life_s, clock(), link, f"{prefix}:fairq:{{{model}}}", clock
    )
