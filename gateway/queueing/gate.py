"""One model's slots: a request takes one before it is dispatched and gives it back when its
stream ends; when every slot is taken it waits in the model's fair queue.

The fast path (a slot free and nobody waiting) is a counter and a charge to the local ledger:
no queue entry, no future, no store.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.errors import RateLimitError, ServiceUnavailableError
from gateway.queueing.scheduler import FairQueue, Flow, Ledger
from gateway.queueing.settings import QueueSettings

logger = logging.getLogger(__name__)
Clock = Callable[[], float]
ANONYMOUS = Flow("anonymous")
"""The flow of a request that names none (a call from outside the HTTP path)."""


@dataclass(slots=True)
class Slot:
    """A slot held by one request, and what its tenant was charged for it."""

    flow: Flow
    charged: float
    released: bool = False


@dataclass(slots=True)
class FlowStats:
    """What one tenant got from one model, for the metrics."""

    dispatched: int = 0
    queued: int = 0
    """Requests that waited before their slot."""
    refused: int = 0
    tokens: float = 0.0
    wait_s: float = 0.0
    """Seconds waited in the queue, summed."""


class ModelSlots:
    """The slots of one model (``capacity`` of them, read at each use: a pool's capacity
    follows its routable replicas) and the queue of the requests waiting for one."""

    def __init__(
        self,
        model: str,
        capacity: Callable[[], int],
        settings: QueueSettings,
        *,
        retry_after_s: int = 5,
        clock: Clock = time.monotonic,
        ledger: Ledger | None = None,
    ) -> None:
        self.model = model
        self.capacity = capacity
        self.settings = settings
        self.retry_after_s = retry_after_s
        self.clock = clock
        self.ledger = ledger or Ledger(settings.half_life_s, epoch=clock())
        self.queue: FairQueue[asyncio.Future[None]] = FairQueue(self.ledger)
        self.in_flight = 0
        self.stats: dict[str, FlowStats] = {}

    def _stats(self, tenant: str) -> FlowStats:
        stats = self.stats.get(tenant)
        if stats is None:
            stats = self.stats[tenant] = FlowStats()
        return stats

    def try_acquire(self, flow: Flow, cost: float) -> Slot | None:
        """A slot at once, when one is free and nobody waits for one; else None.

        Charged at once all the same: a tenant holding slots is being served, and must rank so
        when others start to wait."""
        if self.queue.length == 0 and self.in_flight < self.capacity():
            self.in_flight += 1
            return self._charge(flow, cost)
        return None

    async def acquire(self, flow: Flow, cost: float) -> Slot:
        """A slot for a request of ``flow`` expected to cost ``cost`` tokens: at once when one
        is free and nobody waits, else once the queue gives it one.

        Raises 429 when the flow has ``max_queued`` requests waiting already, or when its wait
        ends over its share; 503 when the wait ends with the model full. A cancelled wait (the
        client left) leaves the queue at once.
        """
        slot = self.try_acquire(flow, cost)
        if slot is not None:
            return slot
        limit = flow.max_queued if flow.max_queued is not None else self.settings.max_queued
        if not self.settings.enabled:
            self._stats(flow.tenant).refused += 1
            raise ServiceUnavailableError(
                f"{self.model} is at its capacity; please retry.",
                code="overloaded",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        if self.queue.depth(flow.tenant) >= limit:
            self._stats(flow.tenant).refused += 1
            raise RateLimitError(
                f"Too many requests of yours are waiting for {self.model}; please retry.",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        since = self.clock()
        self.queue.push(waiter, flow, since)
        try:
            async with asyncio.timeout(self.settings.max_queue_wait_s):
                await waiter
        except BaseException as exc:
            self._left(waiter, flow, exc)
            raise
        stats = self._stats(flow.tenant)
        stats.queued += 1
        stats.wait_s += self.clock() - since
        return self._charge(flow, cost)

    def _left(self, waiter: asyncio.Future[None], flow: Flow, exc: BaseException) -> None:
        """The wait ended without its slot: out of the queue, or, granted in the meantime, the
        slot passed on."""
        if not self.queue.remove(waiter):
            if waiter.done() and not waiter.cancelled():
                self.in_flight -= 1
                self._pump()
            return
        if isinstance(exc, TimeoutError):
            self._stats(flow.tenant).refused += 1
            over = self.queue.over_share(flow)
            kind = RateLimitError if over else ServiceUnavailableError
            why = "more than your share of" if over else "a slot of"
            raise kind(
                f"Waited {self.settings.max_queue_wait_s:g} s for {why} {self.model}, which "
                "is at capacity; please retry.",
                code="queue_timeout" if over else "overloaded",
                headers={"Retry-After": str(self.retry_after_s)},
            ) from None

    def _charge(self, flow: Flow, cost: float) -> Slot:
        self.ledger.charge(flow.tenant, cost, self.clock())
        stats = self._stats(flow.tenant)
        stats.dispatched += 1
        stats.tokens += cost
        return Slot(flow, cost)

    def release(self, slot: Slot, used: float) -> None:
        """The request of ``slot`` ended having used ``used`` tokens; its slot goes to the
        next request waiting."""
        if slot.released:
            return
        slot.released = True
        correction = used - slot.charged
        if correction:
            self.ledger.charge(slot.flow.tenant, correction, self.clock())
            self._stats(slot.flow.tenant).tokens += correction
        self.in_flight -= 1
        if self.queue.length:
            self._pump()

    def pump(self) -> None:
        """The capacity may have grown (a replica came up, an engine's waiting queue drained):
        give the new slots to the requests waiting, which would otherwise wait for a release.
        Nothing to do, and nothing read, while nobody waits."""
        if self.queue.length:
            self._pump()

    def _pump(self) -> None:
        """Give free slots to the next requests waiting (work-conserving: a free slot never
        waits while a request does)."""
        capacity = self.capacity()
        while self.in_flight < capacity:
            popped = self.queue.pop()
            if popped is None:
                return
            waiter = popped[0]
            if waiter.done():
                continue
            self.in_flight += 1
            waiter.set_result(None)

    def waiting(self) -> int:
        """Requests waiting for a slot."""
        return len(self.queue)

    def oldest_wait_s(self) -> float:
        """How long the longest-waiting request has waited (0 when none waits)."""
        now = self.clock()
        return max((now - since for _, since in self.queue.heads()), default=0.0)

    def saturation(self) -> float:
        """Demand over capacity: in flight plus waiting, divided by the slots (an autoscaler's
        target is 1)."""
        capacity = self.capacity()
        demand = self.in_flight + len(self.queue)
        return demand / capacity if capacity else math.inf if demand else 0.0
