"""A request's admission while the request is prepared, and what it reserves.

A shared store (Redis) answers an admission after a round trip: two wake-ups and a script, a few
hundred microseconds on an idle host. Its command is sent as soon as the plan is counted, and
the answer is awaited only once the Triton request is prepared, just before anything is sent
to Triton (``gateway/core/generation.py``), so the two overlap, and a refused request never reaches
Triton. For a tenant that its last answer left far from every limit (``quota.far_from_limits``)
the request goes to Triton before its command is even written (``Tenancy.admission``), and the
answer then overlaps the engine's first token; should the answer refuse after all, the request
is stopped there before any of its output is passed on. The memory store decides at once and
has nothing to overlap.

What a plan costs a tenant: the tokens its admission reserves (``reservation``) and the engine
sequences it holds against the concurrency limit while it runs (``sequences``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from gateway.core.plan import Plan
from gateway.tenancy.config import TenantPolicy
from gateway.tenancy.quota import Limits, Quota, rate_limit_headers

SETTLE_GRACE_S = 5.0
"""How long a ticket's settlement may go on once its request is being cancelled."""


class Settles(Protocol):
    """Where a ticket is settled: the store side of tenancy (``Tenancy.settle``)."""

    async def settle(self, ticket: TenantTicket, used: int) -> None: ...


@dataclass(eq=False)
class TenantTicket:
    """One admitted request: its reservation, lease and headers, settled once its answer ends."""

    tenancy: Settles
    tenant: TenantPolicy
    limits: Limits
    reserved: int
    lease: str
    quota: Quota | None
    """None when the store was unreachable and the request was let through."""
    settled: bool = field(default=False)

    def headers(self) -> dict[str, str]:
        """The rate-limit headers of the answer."""
        return rate_limit_headers(self.quota)

    async def settle_shielded(self, used: int) -> None:
        """``settle``, completed even when the request is being cancelled (within a grace)."""
        task = asyncio.current_task()
        if task is not None and not task.cancelling():
            await self.settle(used)
            return
        with anyio.move_on_after(SETTLE_GRACE_S, shield=True):
            await self.settle(used)

    async def settle(self, used: int) -> None:
        """Give back what the request reserved but did not use, and end its lease."""
        if self.settled:
            return
        self.settled = True
        await self.tenancy.settle(self, used)


class Admission:
    """The admission of one request, decided or under way.

    ``admitted`` waits for the store's answer (a refusal raises the client's error, with its
    headers); ``expected`` says that the answer is all but sure to admit, so the request may
    be sent to Triton before it comes (a refusal then stops it); once admitted, the ticket's
    rate-limit headers go into ``headers``, the answer's.
    ``settle`` settles the ticket whatever happened meanwhile, a request cancelled before its
    admission was answered included.
    """

    def __init__(
        self,
        answer: asyncio.Future[TenantTicket],
        headers: dict[str, str],
        bound_s: float,
        *,
        expected: bool = False,
    ) -> None:
        self.expected = expected
        self._answer = answer
        self._headers = headers
        self._bound_s = bound_s
        self._shown = False
        if answer.done():
            self._show(answer.result())

    @classmethod
    def decided(cls, ticket: TenantTicket, headers: dict[str, str], bound_s: float) -> Admission:
        """An admission the store answered already."""
        answer: asyncio.Future[TenantTicket] = asyncio.get_running_loop().create_future()
        answer.set_result(ticket)
        return cls(answer, headers, bound_s)

    @classmethod
    def pending(
        cls,
        ticket: Awaitable[TenantTicket],
        headers: dict[str, str],
        bound_s: float,
        *,
        expected: bool = False,
    ) -> Admission:
        """An admission whose store command is on its way: its answer is read in a task of its
        own, so a request cancelled meanwhile still learns whether it holds a ticket."""
        return cls(asyncio.ensure_future(ticket), headers, bound_s, expected=expected)

    async def admitted(self) -> None:
        """Wait for the store's answer; a refusal raises the client's error."""
        self._show(await asyncio.shield(self._answer))

    async def settle(self, used: int) -> None:
        """Settle the ticket with ``used`` tokens if the request was admitted (its headers then
        go into the answer's, an error's included)."""
        answer = self._answer
        if not answer.done():
            # The store's answer (its call has a timeout shorter than the bound), even while
            # this request is being cancelled.
            with anyio.move_on_after(self._bound_s, shield=True):
                await asyncio.wait([answer])
        if not answer.done():
            # Later than its own timeout allows: settled in the background when it comes.
            answer.add_done_callback(functools.partial(_settle_later, used=used))
            return
        if answer.cancelled() or answer.exception() is not None:
            return
        ticket = answer.result()
        self._show(ticket)
        await ticket.settle_shielded(used)

    def _show(self, ticket: TenantTicket) -> None:
        if not self._shown:
            self._shown = True
            self._headers.update(ticket.headers())


_LATE: set[asyncio.Task[None]] = set()
"""Settlements of admissions answered after their request gave up waiting."""


def _settle_later(answer: asyncio.Future[TenantTicket], used: int) -> None:
    if answer.cancelled() or answer.exception() is not None:
        return
    task = asyncio.ensure_future(answer.result().settle_shielded(used))
    _LATE.add(task)
    task.add_done_callback(_LATE.discard)


def reservation(plan: Plan) -> int:
    """The most tokens a plan can use: each prompt once, plus every choice's ``max_tokens``; a
    beam search generates (and is charged) ``width`` beams of a prompt, however few it returns."""
    prompts = {spec.prompt_index: spec.prompt.token_count for spec in plan.choices}
    outputs: dict[int, int] = {}
    for spec in plan.choices:
        beam = spec.params.beam
        if beam is None:
            outputs[spec.index] = spec.params.max_tokens
        else:
            outputs[-1 - spec.prompt_index] = beam.width * spec.params.max_tokens
    return sum(prompts.values()) + sum(outputs.values())


def sequences(plan: Plan) -> int:
    """Engine sequences a plan runs at once: one per choice, or a beam search's ``width`` per
    prompt, however few beams it returns."""
    widths: dict[int, int] = {}
    for spec in plan.choices:
        beam = spec.params.beam
        widths[spec.index if beam is None else -1 - spec.prompt_index] = (
            1 if beam is None else beam.width
        )
    return sum(widths.values())
