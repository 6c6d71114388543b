"""One model's replicas: their state, and the choice of one for each request."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from adapters.contract import BackendUnavailable, GenerationRequest, ModelTarget
from gateway.errors import ServiceUnavailableError
from gateway.replicas.affinity import AdapterIndex, PrefixIndex, block_hashes
from gateway.replicas.health import Health, Reason, stalled
from gateway.replicas.policy import Candidate, Request, choose
from gateway.replicas.settings import RoutingSettings
from gateway.replicas.signals import EngineSignals
from gateway.replicas.sources import ReplicaAddress

logger = logging.getLogger(__name__)
Clock = Callable[[], float]
_STALE_SCRAPES = 4
"""Scraped signals older than this many intervals are not used."""


class Replica:
    """One Triton replica of a model as the router sees it."""

    def __init__(self, endpoint: ReplicaAddress, target: ModelTarget, health: Health) -> None:
        self.endpoint = endpoint
        self.target = replace(target, url=endpoint.url, http_url=endpoint.http_url)
        """The model's target with this replica's addresses."""
        self.health = health
        self.in_flight = 0
        self.last_progress = 0.0
        self.signals: EngineSignals | None = None
        self.signals_at = 0.0
        self.waiting_first: set[asyncio.Timeout] = set()
        """Requests still waiting for their first token here, to be moved if it is ejected."""
        self.routed = 0
        self.retries = 0
        self.prefix_hits = 0
        self.adapter_hits = 0

    @property
    def name(self) -> str:
        """The replica's name in metrics and traces."""
        return self.endpoint.name

    def started(self, now: float) -> None:
        """A request was sent here."""
        if self.in_flight == 0:
            self.last_progress = now
        self.in_flight += 1

    def ended(self) -> None:
        """A request sent here ended."""
        self.in_flight -= 1

    def fresh_signals(self, now: float, interval_s: float) -> EngineSignals | None:
        """The scraped signals, unless they are too old to trust."""
        if self.signals is None or now - self.signals_at > _STALE_SCRAPES * interval_s:
            return None
        return self.signals

    def interrupt_waiting(self) -> None:
        """Make the requests still waiting for a first token here give up on it."""
        if not self.waiting_first:
            return
        loop = asyncio.get_running_loop()
        for scope in list(self.waiting_first):
            scope.reschedule(loop.time())


@dataclass(frozen=True, slots=True)
class Routed:
    """The replica chosen for a request, and whether affinity chose it."""

    replica: Replica
    prefix_hit: bool
    adapter_hit: bool


class ReplicaPool:
    """The replicas of one model, with the affinity memory and the policy that spreads requests."""

    def __init__(
        self,
        model: str,
        target: ModelTarget,
        settings: RoutingSettings,
        *,
        retry_after_s: int = 5,
        clock: Clock = time.monotonic,
    ) -> None:
        self.model = model
        self.target = target
        self.settings = settings
        self.retry_after_s = retry_after_s
        self.clock = clock
        self.replicas: dict[str, Replica] = {}
        self.prefixes = PrefixIndex(settings.prefix_entries)
        self.adapters = AdapterIndex(settings.adapter_slots)
        self.overloaded = 0
        """Requests refused because every replica was saturated."""
        self._turn = 0
        self._grown: list[Callable[[], None]] = []

    def on_capacity(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever the pool may take more requests than before: a replica
        came up, or fresh load signals were read."""
        self._grown.append(listener)

    def capacity_may_grow(self) -> None:
        """Tell the listeners that the pool's ``slots()`` may have grown."""
        for listener in self._grown:
            listener()

    def update(self, endpoints: Sequence[ReplicaAddress]) -> tuple[list[str], list[str]]:
        """Make the pool these endpoints: the names added and removed. Requests in flight on a
        removed replica finish there."""
        wanted = {endpoint.name: endpoint for endpoint in endpoints}
        removed = [name for name in self.replicas if name not in wanted]
        for name in removed:
            self.prefixes.forget(name)
            self.adapters.forget(name)
            del self.replicas[name]
        added = [name for name in wanted if name not in self.replicas]
        for name in added:
            health = Health(
                self.settings.eject_s,
                self.settings.max_eject_s,
                probe_misses=self.settings.probe_misses,
            )
            self.replicas[name] = Replica(wanted[name], self.target, health)
        if added or removed:
            logger.info("model %s: replicas %s", self.model, sorted(self.replicas))
        return added, removed

    @property
    def block_tokens(self) -> int:
        """Tokens per prompt block: the engines' KV-cache block size once one reported it."""
        for replica in self.replicas.values():
            if replica.signals is not None and replica.signals.tokens_per_block:
                return replica.signals.tokens_per_block
        return self.settings.prefix_block_tokens

    def ready(self) -> bool:
        """Whether at least one replica takes requests."""
        return any(replica.health.routable for replica in self.replicas.values())

    def saturated(self, replica: Replica, now: float) -> bool:
        """Whether ``replica`` is at the configured queue depth."""
        limit = self.settings.max_in_flight
        if limit is not None and replica.in_flight >= limit:
            return True
        limit_waiting = self.settings.max_waiting
        signals = replica.fresh_signals(now, self.settings.scrape_interval_s)
        return (
            limit_waiting is not None and signals is not None and (signals.waiting >= limit_waiting)
        )

    def slots(self) -> int:
        """Requests the pool takes at once: ``max_in_flight`` on each routable replica, but no
        more than it holds now on one whose engine reports ``max_waiting`` waiting; while none
        is routable, one replica's (a request then finds the pool down rather than waiting)."""
        limit = self.settings.max_in_flight or 0
        now = self.clock()
        routable = [replica for replica in self.replicas.values() if replica.health.routable]
        if not routable:
            return limit
        return sum(self._slots_of(replica, limit, now) for replica in routable)

    def _slots_of(self, replica: Replica, limit: int, now: float) -> int:
        most_waiting = self.settings.max_waiting
        signals = replica.fresh_signals(now, self.settings.scrape_interval_s)
        if most_waiting is not None and signals is not None and signals.waiting >= most_waiting:
            return min(replica.in_flight, limit)
        return limit

    def pick(self, request: GenerationRequest, exclude: Collection[Replica] = ()) -> Routed:
        """The replica for ``request`` (not one of ``exclude``), remembered for affinity.

        No replica up: ``BackendUnavailable``; every one saturated: 503 ``overloaded``.
        """
        now = self.clock()
        routable = [r for r in self.replicas.values() if r.health.routable and r not in exclude]
        if not routable:
            raise BackendUnavailable(f"no replica of {self.model} is available")
        candidates = [r for r in routable if not self.saturated(r, now)]
        if not candidates:
            self.overloaded += 1
            raise ServiceUnavailableError(
                f"Every replica of {self.model} is at its queue depth; please retry.",
                code="overloaded",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        settings = self.settings
        hashes = block_hashes(
            request.prompt_ids, self.block_tokens, settings.prefix_max_blocks, request.cache_salt
        )
        depths = self.prefixes.matches(hashes) if hashes else {}
        adapter = request.lora.name if request.lora is not None else None
        owner = self.adapters.owner(adapter) if adapter is not None else None
        index = choose(
            settings.policy,
            [self._candidate(r, now, depths, owner) for r in candidates],
            Request(prompt_blocks=len(hashes), adapter=adapter is not None),
            weights=settings.weights,
            load_factor=settings.load_factor,
            load_slack=settings.load_slack,
            turn=self._turn,
        )
        self._turn += 1
        chosen = candidates[index]
        routed = Routed(
            chosen,
            prefix_hit=depths.get(chosen.name, 0) > 0,
            adapter_hit=owner == chosen.name,
        )
        self._remember(routed, hashes, adapter)
        return routed

    def _candidate(
        self, replica: Replica, now: float, depths: dict[str, int], owner: str | None
    ) -> Candidate:
        signals = replica.fresh_signals(now, self.settings.scrape_interval_s) or EngineSignals()
        return Candidate(
            name=replica.name,
            in_flight=replica.in_flight,
            waiting=signals.waiting,
            kv_fraction=signals.kv_fraction,
            prefix_blocks=depths.get(replica.name, 0),
            holds_adapter=owner == replica.name,
            # Room counts only for an adapter nobody holds: it must not lure the requests of
            # one that is held away from its replica.
            adapter_room=owner is None and self.adapters.has_room(replica.name),
        )

    def _remember(self, routed: Routed, hashes: Sequence[int], adapter: str | None) -> None:
        replica = routed.replica
        replica.routed += 1
        replica.prefix_hits += routed.prefix_hit
        replica.adapter_hits += routed.adapter_hit
        if hashes:
            self.prefixes.record(hashes, replica.name)
        if adapter is not None:
            self.adapters.record(adapter, replica.name)

    def failed(self, replica: Replica, reason: Reason) -> None:
        """A request, probe or stall check failed on ``replica``; eject it if it was up."""
        if replica.health.failed(reason, self.clock()):
            self._ejected(replica, reason)

    def probed(self, replica: Replica, ready: bool, *, timed_out: bool = False) -> None:
        """A readiness probe of ``replica`` answered (or ``timed_out``)."""
        was = replica.health.state
        if replica.health.probed(ready, self.clock(), timed_out=timed_out):
            self._ejected(replica, "probe")
        elif replica.health.state == "up" and was != "up":
            logger.info("model %s: replica %s is up", self.model, replica.name)
            self.capacity_may_grow()

    def check_stalls(self) -> None:
        """Eject the replicas that have requests in flight and produced nothing for a while."""
        now = self.clock()
        for replica in list(self.replicas.values()):
            if replica.health.routable and stalled(
                replica.in_flight, replica.last_progress, now, self.settings.stall_s
            ):
                self.failed(replica, "stalled")

    def _ejected(self, replica: Replica, reason: Reason) -> None:
        logger.warning(
            "model %s: replica %s ejected (%s) for %.1f s",
            self.model,
            replica.name,
            reason,
            replica.health.until - self.clock(),
        )
        # It may restart with empty caches: let affinity find new owners.
        self.prefixes.forget(replica.name)
        self.adapters.forget(replica.name)
        replica.interrupt_waiting()
