"""A replica's health as a small state machine: pending, up or ejected (pure; time is passed in).

::

    pending ──probe ok──► up ──failure (request, probe, stall)──► ejected
                          ▲                                          │
                          └──── half-open probe ok, after eject_s ◄──┘
                                 (a failed one doubles the time out, up to max_eject_s)

A replica is pending until a probe first finds it ready, and only an ``up`` replica gets
requests. A probe that answers "not ready" or cannot connect fails at once; one that times out
fails only as the ``probe_misses``-th in a row (a busy host answers late, a dead one refuses).
An ejected replica is not probed until its time out has passed; the first probe after that is
the half-open one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

State = Literal["pending", "up", "ejected"]
Reason = Literal["unavailable", "probe", "stalled"]


@dataclass(slots=True)
class Health:
    """One replica's circuit breaker."""

    eject_s: float
    max_eject_s: float
    probe_misses: int = 1
    """Probes in a row that time out before that counts as a failed probe."""
    missed: int = 0
    state: State = "pending"
    until: float = 0.0
    """When an ejected replica may be probed again."""
    next_eject_s: float = 0.0
    ejections: Counter[str] = field(default_factory=Counter)
    """Times it was ejected, by reason."""

    def __post_init__(self) -> None:
        self.next_eject_s = self.eject_s

    @property
    def routable(self) -> bool:
        """Whether requests may go to the replica."""
        return self.state == "up"

    def probe_due(self, now: float) -> bool:
        """Whether a readiness probe should be sent now."""
        return self.state != "ejected" or now >= self.until

    def failed(self, reason: Reason, now: float) -> bool:
        """A request, a probe or the stall check failed; True when that ejected the replica."""
        if self.state == "up":
            self.ejections[reason] += 1
            self._eject(now)
            return True
        if self.state == "ejected" and now >= self.until:
            self.next_eject_s = min(self.next_eject_s * 2, self.max_eject_s)
            self._eject(now)
        return False

    def probed(self, ready: bool, now: float, *, timed_out: bool = False) -> bool:
        """A readiness probe answered (or ``timed_out``); True when that ejected the replica."""
        if ready:
            self.missed = 0
            if self.probe_due(now):
                self.state = "up"
                self.next_eject_s = self.eject_s
            return False
        if self.state == "pending":
            return False
        if timed_out and self.state == "up":
            self.missed += 1
            if self.missed < self.probe_misses:
                return False
        self.missed = 0
        return self.failed("probe", now)

    def _eject(self, now: float) -> None:
        self.state = "ejected"
        self.until = now + self.next_eject_s


def stalled(in_flight: int, last_progress: float, now: float, stall_s: float) -> bool:
    """Requests in flight and no token from the replica for ``stall_s`` seconds."""
    return in_flight > 0 and now - last_progress >= stall_s
