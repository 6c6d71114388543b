"""Which queued request a freed slot goes to: the pure part of fair queueing.

Requests wait in one FIFO queue per flow (a tenant). A freed slot goes to the highest
priority class that has a queued request, and within it to the flow that was served least
for its weight: least attained service, each flow's tokens divided by its ``weight``, decayed
with a half-life so that what a tenant used a minute ago no longer counts against it (llm-d's
flow control orders flows the same way, its "LAS with decay").

Attained service rather than deficit round robin: a flow's standing is one number that only
grows by what is dispatched and decays with time, so several gateway processes can add to it
in a shared store and read each other's, where DRR's deficits and round pointer are state that
every scheduler would have to update under one lock.

Decay is kept forward (Cormode et al., "Forward decay"): a charge made at time ``t`` is stored
as ``cost * 2 ** (t / half_life)``. Every flow's standing at a time ``now`` is then its stored
sum times the same ``2 ** (-now / half_life)``, so flows are compared on their stored sums
alone and nothing is ever rewritten to decay. The sums are rebased (all divided by the same
factor) before they could overflow a float.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
_REBASE_EXPONENT = 512.0
"""Stored sums are rebased once their scale passes ``2 ** _REBASE_EXPONENT`` (floats end at
``2 ** 1024``)."""


@dataclass(frozen=True, slots=True)
class Flow:
    """Who a request is queued for: its tenant, its share and its class."""

    tenant: str
    weight: float = 1.0
    """Share of tokens relative to the other flows queued in the same class."""
    priority_class: int = 0
    """Queued requests of a higher class are served before any of a lower one."""
    max_queued: int | None = None
    """Most requests of this flow that may wait at once on one model; None: no bound here."""


class Ledger:
    """Each flow's attained service, decayed with ``half_life_s``, in forward-decayed sums."""

    def __init__(self, half_life_s: float, epoch: float = 0.0) -> None:
        self.half_life_s = half_life_s
        self.epoch = epoch
        """Time at which a stored sum equals the standing itself."""
        self.sums: dict[str, float] = {}

    def scale(self, now: float) -> float:
        """What a cost charged at ``now`` is multiplied by when stored."""
        exponent = (now - self.epoch) / self.half_life_s
        if exponent > _REBASE_EXPONENT:
            self.rebase(now)
            exponent = 0.0
        return float(2.0**exponent)

    def rebase(self, now: float) -> None:
        """Move the epoch to ``now``, dividing every sum by the same factor (orders unchanged)."""
        factor = math.pow(2.0, -(now - self.epoch) / self.half_life_s)
        self.sums = {tenant: value * factor for tenant, value in self.sums.items()}
        self.epoch = now

    def charge(self, tenant: str, cost: float, now: float) -> None:
        """``tenant`` was served ``cost`` tokens (negative: fewer than charged before)."""
        scale = self.scale(now)
        value = self.sums.get(tenant, 0.0) + cost * scale
        self.sums[tenant] = value if value > 0.0 else 0.0

    def standing(self, tenant: str, now: float) -> float:
        """Tokens attained by ``tenant``, decayed to ``now``."""
        return self.sums.get(tenant, 0.0) / self.scale(now)

    def stored(self, tenant: str) -> float:
        """The flow's stored (forward-decayed) sum: comparable between flows, not over time."""
        return self.sums.get(tenant, 0.0)


@dataclass(slots=True)
class _Queued(Generic[Item]):
    item: Item
    flow: Flow
    since: float


@dataclass(slots=True)
class _Class(Generic[Item]):
    flows: dict[str, deque[_Queued[Item]]] = field(default_factory=dict)


class FairQueue(Generic[Item]):
    """Per-flow queues in priority classes; ``pop`` gives the next item to serve."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._classes: dict[int, _Class[Item]] = {}
        self._where: dict[int, tuple[int, str]] = {}
        self.length = 0
        """Items queued (an attribute, read on every request's fast path)."""

    def __len__(self) -> int:
        return self.length

    def depth(self, tenant: str) -> int:
        """Requests of ``tenant`` waiting, over every class."""
        return sum(len(c.flows.get(tenant, ())) for c in self._classes.values())

    def depths(self) -> dict[str, int]:
        """Requests waiting by tenant."""
        found: dict[str, int] = {}
        for level in self._classes.values():
            for tenant, queue in level.flows.items():
                found[tenant] = found.get(tenant, 0) + len(queue)
        return found

    def push(self, item: Item, flow: Flow, now: float) -> None:
        """Queue ``item`` for ``flow`` behind the flow's earlier ones."""
        level = self._classes.setdefault(flow.priority_class, _Class())
        level.flows.setdefault(flow.tenant, deque()).append(_Queued(item, flow, now))
        self._where[id(item)] = (flow.priority_class, flow.tenant)
        self.length += 1

    def remove(self, item: Item) -> bool:
        """Take ``item`` out of its queue (its client left); False when it is not queued."""
        where = self._where.pop(id(item), None)
        if where is None:
            return False
        level = self._classes[where[0]]
        queue = level.flows[where[1]]
        for queued in queue:
            if queued.item is item:
                queue.remove(queued)
                break
        self.length -= 1
        self._prune(where)
        return True

    def pop(self) -> tuple[Item, Flow, float] | None:
        """The next item to serve, its flow and when it was queued; None when none waits."""
        if not self._classes:
            return None
        top = max(self._classes)
        level = self._classes[top]
        tenant = min(level.flows, key=lambda name: self._rank(level.flows[name]))
        queued = level.flows[tenant].popleft()
        del self._where[id(queued.item)]
        self.length -= 1
        self._prune((top, tenant))
        return queued.item, queued.flow, queued.since

    def _rank(self, queue: deque[_Queued[Item]]) -> tuple[float, float]:
        head = queue[0]
        # Ties (flows never served) go to the one that has waited longest.
        return self.ledger.stored(head.flow.tenant) / head.flow.weight, head.since

    def heads(self) -> Iterator[tuple[Flow, float]]:
        """Each queued flow's oldest request: its flow and when it was queued."""
        for level in self._classes.values():
            for queue in level.flows.values():
                yield queue[0].flow, queue[0].since

    def over_share(self, flow: Flow) -> bool:
        """Whether ``flow`` has attained more, for its weight, than another flow waiting in its
        class or above: the flow is over its share, not the model merely full."""
        own = self.ledger.stored(flow.tenant) / flow.weight
        for level, entries in self._classes.items():
            if level < flow.priority_class:
                continue
            for tenant, queue in entries.flows.items():
                if tenant != flow.tenant and queue:
                    other = queue[0].flow
                    if self.ledger.stored(tenant) / other.weight < own:
                        return True
        return False

    def _prune(self, where: tuple[int, str]) -> None:
        level = self._classes[where[0]]
        if not level.flows[where[1]]:
            del level.flows[where[1]]
        if not level.flows:
            del self._classes[where[0]]
