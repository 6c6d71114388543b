"""Limits of a tenant, what is left of them, the stores that count them, and what an answer
says of them.

Each limit is counted with the generic cell rate algorithm with costs: smooth limits without
window boundaries. A limit of ``rate`` units per ``period`` seconds refills continuously and holds
at most ``capacity`` units, so no burst is ever larger than ``capacity`` and a long run never
admits more than ``capacity + rate * time``. Its whole state is one number, the theoretical
arrival time (TAT): the moment the bucket would be full again. The Redis store
(``gateway.tenancy.redis_store``) runs the same arithmetic in Lua; this module is the reference
and the memory store's implementation.

A store admits a request in one step that checks every limit and takes from all of them only
if all allow it, and settles it in one step that gives back the unused reservation and
releases its concurrency lease. An answer carries OpenAI's ``x-ratelimit-*`` headers of what is
left; a refusal is the 429 naming the limit, with when to retry.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gateway.errors import RateLimitError
from gateway.tenancy.config import TenantPolicy

EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Limit:
    """``rate`` units per ``period`` seconds, at most ``capacity`` units at once."""

    name: str
    rate: float
    period: float
    capacity: float

    @property
    def interval(self) -> float:
        """Seconds that one unit takes to refill."""
        return self.period / self.rate

    @property
    def tolerance(self) -> float:
        """How far the TAT may run ahead of now: the bucket's capacity in seconds."""
        return self.capacity * self.interval


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of asking a limit for ``cost`` units at one moment."""

    allowed: bool
    tat: float
    """The TAT after the request (unchanged when denied)."""
    retry_after: float
    """Seconds until the same request would be allowed (0 when allowed)."""
    remaining: float
    """Units left right after the decision."""
    reset_after: float
    """Seconds until the bucket is full again."""


def take(limit: Limit, tat: float, now: float, cost: float) -> Decision:
    """Ask ``limit`` for ``cost`` units at ``now``, given its current ``tat``."""
    base = max(tat, now)
    new_tat = base + cost * limit.interval
    if new_tat - now > limit.tolerance + EPSILON:
        return Decision(
            allowed=False,
            tat=tat,
            retry_after=new_tat - limit.tolerance - now,
            remaining=max(0.0, (limit.tolerance - (base - now)) / limit.interval),
            reset_after=base - now,
        )
    return Decision(
        allowed=True,
        tat=new_tat,
        retry_after=0.0,
        remaining=max(0.0, (limit.tolerance - (new_tat - now)) / limit.interval),
        reset_after=new_tat - now,
    )


def give_back(limit: Limit, tat: float, now: float, units: float) -> float:
    """The TAT after returning ``units`` (negative: charging more than was taken)."""
    return (
        max(tat - units * limit.interval, now)
        if units >= 0
        else max(tat, now) - units * limit.interval
    )


def status(limit: Limit, tat: float, now: float) -> Decision:
    """What is left now, without taking anything."""
    return take(limit, tat, now, 0.0)


def whole(value: float) -> int:
    """Units as a whole number for headers: never rounds a partial unit up."""
    return math.floor(value + EPSILON)


MINUTE = 60.0
DAY = 86400.0
CONCURRENCY_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits of one tenant, as the stores count them."""

    requests: Limit | None = None
    tokens: Limit | None = None
    daily_tokens: Limit | None = None
    concurrency: int | None = None

    @classmethod
    def of(cls, policy: TenantPolicy) -> Limits:
        """The limits a policy sets; a minute's limits hold ``burst`` of their quota at once."""

        def per(name: str, rate: int | None, period: float, burst: float) -> Limit | None:
            if rate is None:
                return None
            return Limit(name, float(rate), period, max(1.0, rate * burst))

        return cls(
            requests=per("requests", policy.requests_per_minute, MINUTE, policy.burst),
            tokens=per("tokens", policy.tokens_per_minute, MINUTE, policy.burst),
            daily_tokens=per("tokens_per_day", policy.tokens_per_day, DAY, 1.0),
            concurrency=policy.max_concurrency,
        )

    @property
    def buckets(self) -> tuple[tuple[Limit | None, bool], ...]:
        """Each bucket and whether it counts tokens (else requests), in a fixed order."""
        return ((self.requests, False), (self.tokens, True), (self.daily_tokens, True))

    def largest_reservation(self) -> float | None:
        """The most tokens one request may ever reserve: what the smallest bucket holds."""
        sizes = [limit.capacity for limit, tokens in self.buckets if tokens and limit]
        return min(sizes) if sizes else None


@dataclass(frozen=True, slots=True)
class Quota:
    """What is left of a tenant's request and token limits, for the rate-limit headers."""

    requests: tuple[Limit, Decision] | None = None
    tokens: tuple[Limit, Decision] | None = None


HEADROOM = 0.25
"""The share of every bucket a request must leave in the last answer's count to be sent ahead
of its admission: other requests of the tenant (other workers' and replicas' included) would
have to take that much since, all at once, for the admission to refuse it."""


def far_from_limits(limits: Limits, known: Quota | None, tokens: int, requests: int = 1) -> bool:
    """Whether the tenant's last answer (``known``) left it so far from its ``limits`` that
    ``requests`` more of ``tokens`` in all (this request and those of the tenant still waiting
    for their answers) are all but sure to be admitted: every limit is one the answer shows (a
    concurrency limit is not, nor daily tokens beside per-minute ones), shown as they are now,
    and after them each would still hold ``HEADROOM`` of its capacity."""
    if known is None or limits.concurrency is not None:
        return False
    if limits.tokens is not None and limits.daily_tokens is not None:
        return False
    shown = (
        (limits.requests, known.requests, float(requests)),
        (limits.tokens or limits.daily_tokens, known.tokens, float(tokens)),
    )
    for limit, entry, cost in shown:
        if limit is None and entry is None:
            continue
        if limit is None or entry is None:
            # A limit added or removed since the answer.
            return False
        counted, decision = entry
        if counted != limit or decision.remaining - cost < HEADROOM * limit.capacity:
            return False
    return True


def requests_left(limits: Limits, known: Quota | None, elapsed: float) -> float | None:
    """The most requests the tenant's request limit can hold now, by its last answer (``known``,
    ``elapsed`` seconds ago): only admissions take from it, so it holds no more than the answer
    left plus what refilled since. None where the answer does not show the limit as it is now."""
    if known is None or known.requests is None or limits.requests is None:
        return None
    counted, decision = known.requests
    if counted != limits.requests:
        return None
    return min(counted.capacity, decision.remaining + max(0.0, elapsed) / counted.interval)


class Rejected(Exception):
    """A limit refused the request."""

    def __init__(self, limit: str, retry_after: float, quota: Quota) -> None:
        super().__init__(limit)
        self.limit = limit
        """``requests``, ``tokens``, ``tokens_per_day`` or ``concurrency``."""
        self.retry_after = retry_after
        self.quota = quota


class StoreUnavailable(Exception):
    """The store could not be asked (Redis down, slow or refusing)."""


class QuotaStore(Protocol):
    """Counts limits: in one process, or shared by every replica."""

    def admit(
        self, tenant: str, limits: Limits, tokens: int, lease: str, sequences: int = 1
    ) -> Awaitable[Quota]:
        """Take one request and ``tokens`` from every limit and open a lease of ``sequences``
        engine sequences against the concurrency limit, or raise (when awaited). A shared store
        sends its command before this returns."""
        ...

    async def settle(self, tenant: str, limits: Limits, refund: int, lease: str) -> None:
        """Give back ``refund`` tokens (negative: charge more) and close the lease."""
        ...

    async def close(self) -> None:
        """Release connections and background tasks."""
        ...


def quota_of(limits: Limits, decisions: Mapping[str, Decision]) -> Quota:
    """The header view of some decisions: requests, and the per-minute (else daily) tokens."""
    tokens = limits.tokens or limits.daily_tokens
    return Quota(
        requests=(limits.requests, decisions[limits.requests.name]) if limits.requests else None,
        tokens=(tokens, decisions[tokens.name]) if tokens else None,
    )


def statuses(limits: Limits, tats: Mapping[str, float], now: float) -> dict[str, Decision]:
    """What is left of every bucket, taking nothing."""
    return {
        limit.name: status(limit, tats.get(limit.name, 0.0), now)
        for limit, _ in limits.buckets
        if limit is not None
    }


@dataclass
class _TenantState:
    tats: dict[str, float] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)
    """Each open lease and the engine sequences it holds."""


class MemoryStore:
    """Limits of one gateway process."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._now = clock
        self._tenants: dict[str, _TenantState] = {}

    def leases(self, tenant: str) -> int:
        """Engine sequences the tenant holds under lease now."""
        state = self._tenants.get(tenant)
        return 0 if state is None else sum(state.leases.values())

    async def admit(
        self, tenant: str, limits: Limits, tokens: int, lease: str, sequences: int = 1
    ) -> Quota:
        """Check every limit, then take from all of them (atomic: no await in between)."""
        now = self._now()
        state = self._tenants.setdefault(tenant, _TenantState())
        decisions: dict[str, Decision] = {}
        for limit, counts_tokens in limits.buckets:
            if limit is None:
                continue
            cost = float(tokens) if counts_tokens else 1.0
            decision = take(limit, state.tats.get(limit.name, 0.0), now, cost)
            if not decision.allowed:
                quota = quota_of(limits, statuses(limits, state.tats, now))
                raise Rejected(limit.name, decision.retry_after, quota)
            decisions[limit.name] = decision
        held = sum(state.leases.values())
        if limits.concurrency is not None and held + sequences > limits.concurrency:
            quota = quota_of(limits, statuses(limits, state.tats, now))
            raise Rejected("concurrency", CONCURRENCY_RETRY_S, quota)
        for name, decision in decisions.items():
            state.tats[name] = decision.tat
        state.leases[lease] = sequences
        return quota_of(limits, decisions)

    async def settle(self, tenant: str, limits: Limits, refund: int, lease: str) -> None:
        """Give back the unused tokens and close the lease."""
        now = self._now()
        state = self._tenants.setdefault(tenant, _TenantState())
        for limit, counts_tokens in limits.buckets:
            if limit is not None and counts_tokens and limit.name in state.tats:
                state.tats[limit.name] = give_back(limit, state.tats[limit.name], now, refund)
        state.leases.pop(lease, None)

    async def close(self) -> None:
        """Nothing to release."""


def duration(seconds: float) -> str:
    """A duration as OpenAI writes it in ``x-ratelimit-reset-*``: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def rate_limit_headers(quota: Quota | None) -> dict[str, str]:
    """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for the limits that apply."""
    headers: dict[str, str] = {}
    for kind, entry in (("requests", quota and quota.requests), ("tokens", quota and quota.tokens)):
        if not entry:
            continue
        limit, decision = entry
        headers[f"x-ratelimit-limit-{kind}"] = str(whole(limit.rate))
        headers[f"x-ratelimit-remaining-{kind}"] = str(whole(decision.remaining))
        headers[f"x-ratelimit-reset-{kind}"] = duration(decision.reset_after)
    return headers


def rate_limit_error(tenant: TenantPolicy, rejected: Rejected) -> RateLimitError:
    """The 429 of a request a limit refused: which limit, and when to retry."""
    retry = max(rejected.retry_after, 0.001)
    headers = {
        **rate_limit_headers(rejected.quota),
        "Retry-After": str(math.ceil(retry)),
        "retry-after-ms": str(math.ceil(retry * 1000)),
    }
    what = {
        "requests": (f"requests per minute (limit {tenant.requests_per_minute})", "requests"),
        "tokens": (f"tokens per minute (limit {tenant.tokens_per_minute})", "tokens"),
        "tokens_per_day": (f"tokens per day (limit {tenant.tokens_per_day})", "tokens"),
        "concurrency": (
            f"sequences in flight at once (limit {tenant.max_concurrency})",
            "requests",
        ),
    }[rejected.limit]
    return RateLimitError(
        f"Rate limit reached for {what[0]} of tenant {tenant.name}. "
        f"Please try again in {duration(retry)}.",
        headers=headers,
        kind=what[1],
    )
