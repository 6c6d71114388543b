"""The generic cell rate algorithm with costs: smooth limits without window boundaries.

A limit of ``rate`` units per ``period`` seconds refills continuously and holds at most
``capacity`` units, so no burst is ever larger than ``capacity`` and a long run never admits
more than ``capacity + rate * time``. Its whole state is one number, the theoretical arrival
time (TAT): the moment the bucket would be full again. The Redis store runs the same arithmetic
in Lua; this module is the reference and the memory store's implementation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
