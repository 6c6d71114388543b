"""The generation core behind a tenant's admission: nothing reaches the backend before it is
admitted unless the request is sent ahead, and a refusal passes nothing on and leaves nothing
running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from adapters.contract import BackendUnavailable, GenerationRequest, ModelTarget
from adapters.scripted import ScriptedBackend
from gateway.catalog.registry import ServedModel
from gateway.core.events import ChoiceEnd, Event, TextDelta
from gateway.core.generation import GenerationService
from gateway.replicas.router import Router
from gateway.replicas.settings import RoutingSettings
from gateway.replicas.sources import ReplicaAddress
from tests.support.generation import chunks, plan


class Gate:
    """An admission answered when the test sets ``answered``; ``waited`` counts its awaits."""

    def __init__(self, *, expected: bool = False) -> None:
        self.answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.expected = expected
        self.waited = 0

    async def admitted(self) -> None:
        self.waited += 1
        await asyncio.shield(self.answered)


def _gated(
    served: ServedModel, choices: int, *, expected: bool = False
) -> tuple[Gate, ScriptedBackend, AsyncGenerator[Event, None]]:
    """Events of ``choices`` scripted choices behind an admission answered when the test sets
    its gate's future."""
    gate = Gate(expected=expected)
    backend = ScriptedBackend(chunks("x", "y"))
    service = GenerationService(backend, timeout_s=5)
    return gate, backend, service.events(served, plan(choices), admission=gate)


async def test_every_choice_waits_for_its_admission_and_a_refusal_sends_nothing(
    served: ServedModel,
) -> None:
    gate, backend, events = _gated(served, 3)
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.05)
    assert not first.done() and backend.requests == []
    gate.answered.set_exception(PermissionError("refused"))
    with pytest.raises(PermissionError):
        await first
    await events.aclose()
    assert backend.requests == [] and backend.closed_early == []


async def test_an_admitted_request_runs_every_choice(served: ServedModel) -> None:
    gate, backend, events = _gated(served, 2)
    gate.answered.set_result(None)
    answered = [e async for e in events]
    assert sorted(e.index for e in answered if isinstance(e, ChoiceEnd)) == [0, 1]
    assert gate.waited == 1 and len(backend.requests) == 2


async def test_a_request_sent_ahead_goes_before_its_answer_and_a_refusal_passes_nothing_on(
    served: ServedModel,
) -> None:
    gate, backend, events = _gated(served, 2, expected=True)
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.05)
    assert not first.done(), "nothing is passed on before the answer"
    assert len(backend.requests) == 2
    gate.answered.set_exception(PermissionError("refused"))
    with pytest.raises(PermissionError):
        await first
    await events.aclose()
    assert sorted(backend.closed_early) == sorted(r.request_id for r in backend.requests)


async def test_a_request_sent_ahead_and_admitted_streams_as_any_other(
    served: ServedModel,
) -> None:
    gate, backend, events = _gated(served, 1, expected=True)
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.05)
    assert not first.done() and len(backend.requests) == 1
    gate.answered.set_result(None)
    rest = [await first] + [event async for event in events]
    assert "".join(e.text for e in rest if isinstance(e, TextDelta)) == "xy"
    assert backend.closed_early == []


async def test_cancelled_while_awaiting_its_admission_a_request_leaves_nothing_behind(
    served: ServedModel,
) -> None:
    gate, backend, events = _gated(served, 2)
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.05)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await events.aclose()
    gate.answered.set_result(None)
    await asyncio.sleep(0.05)
    assert backend.requests == [] and backend.closed_early == []


async def test_a_request_that_cannot_be_prepared_answers_with_its_refusal_first(
    served: ServedModel,
) -> None:
    class Unpreparable(ScriptedBackend):
        async def prepare(self, target: ModelTarget, request: GenerationRequest) -> Any:
            raise BackendUnavailable("no server")

    gate = Gate()
    events = GenerationService(Unpreparable([]), timeout_s=5).events(served, plan(), admission=gate)
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.05)
    assert not first.done(), "the admission answers first"
    gate.answered.set_exception(PermissionError("refused"))
    with pytest.raises(PermissionError):
        await first


async def test_a_pooled_request_sent_ahead_still_waits_for_its_admission_to_pick_a_replica(
    served: ServedModel,
) -> None:
    class Pooled:
        name = "tiny"
        target = served.target
        replicas = (ReplicaAddress("a", "a:1"), ReplicaAddress("b", "b:1"))
        routing = RoutingSettings()

    router = Router([Pooled()])
    pool = router.pool("tiny")
    assert pool is not None
    pool.update(list(Pooled.replicas))
    for replica in pool.replicas.values():
        pool.probed(replica, True)
    backend = ScriptedBackend(chunks("x", "y"))
    gate = Gate(expected=True)
    service = GenerationService(backend, timeout_s=5, dispatcher=router)
    events = service.events(served, plan(2), admission=gate)
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.05)
    assert backend.requests == [], "a pool's request goes once admitted"
    assert [r.routed for r in pool.replicas.values()] == [0, 0]
    gate.answered.set_exception(PermissionError("refused"))
    with pytest.raises(PermissionError):
        await first
    await events.aclose()
    assert backend.requests == [] and [r.in_flight for r in pool.replicas.values()] == [0, 0]
