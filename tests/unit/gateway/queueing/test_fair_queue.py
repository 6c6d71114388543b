"""The fair queue's pure scheduler and a model's slots: who a freed slot goes to, the shares
that result, the bounds and the classes."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

import pytest

from adapters.contract import GenerationRequest, ModelTarget, SamplingParams, TokenChunk
from adapters.scripted import ScriptedBackend
from gateway.errors import RateLimitError, ServiceUnavailableError
from gateway.queueing.flows import (
    FAIRNESS_HEADER,
    OBJECTIVE_HEADER,
    current_flow,
    llm_d_headers,
)
from gateway.queueing.gate import ModelSlots
from gateway.queueing.scheduler import FairQueue, Flow, Ledger
from gateway.queueing.settings import QueueSettings, check_queueing
from gateway.replicas.router import Router
from gateway.replicas.settings import RoutingSettings
from gateway.replicas.sources import ReplicaAddress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _serve(flows: list[Flow], rounds: int, cost: float = 10.0) -> Counter[str]:
    """Tokens each flow gets when every flow always has requests queued and each freed slot
    goes to ``pop``'s choice."""
    ledger = Ledger(half_life_s=1e9)
    queue: FairQueue[object] = FairQueue(ledger)
    for flow in flows:
        for _ in range(2):
            queue.push(object(), flow, 0.0)
    served: Counter[str] = Counter()
    for step in range(rounds):
        popped = queue.pop()
        assert popped is not None
        _, flow, _ = popped
        ledger.charge(flow.tenant, cost, float(step))
        served[flow.tenant] += int(cost)
        queue.push(object(), flow, float(step))
    return served


@pytest.mark.parametrize(
    ("weights", "expected"),
    [((1.0, 1.0), (1, 1)), ((3.0, 1.0), (3, 1)), ((2.0, 1.0, 1.0), (2, 1, 1))],
)
def test_backlogged_flows_share_tokens_by_weight(
    weights: tuple[float, ...], expected: tuple[int, ...]
) -> None:
    flows = [Flow(f"t{index}", weight=weight) for index, weight in enumerate(weights)]
    served = _serve(flows, 400)
    total = sum(served.values())
    for flow, share in zip(flows, expected, strict=True):
        assert served[flow.tenant] / total == pytest.approx(share / sum(expected), abs=0.02)


def test_a_higher_class_is_served_before_any_lower_one() -> None:
    ledger = Ledger(half_life_s=10.0)
    queue: FairQueue[str] = FairQueue(ledger)
    ledger.charge("gold", 1000.0, 0.0)
    queue.push("low-1", Flow("free"), 0.0)
    queue.push("low-2", Flow("free"), 0.0)
    queue.push("high", Flow("gold", priority_class=1), 1.0)
    order = [queue.pop() for _ in range(3)]
    assert [popped[0] for popped in order if popped] == ["high", "low-1", "low-2"]
    assert queue.pop() is None


def test_the_least_served_flow_goes_first_and_ties_go_to_the_longest_waiting() -> None:
    ledger = Ledger(half_life_s=10.0)
    queue: FairQueue[str] = FairQueue(ledger)
    ledger.charge("flood", 500.0, 0.0)
    queue.push("flood", Flow("flood"), 0.0)
    queue.push("b", Flow("b"), 2.0)
    queue.push("a", Flow("a"), 1.0)
    assert [queue.pop()[0] for _ in range(3)] == ["a", "b", "flood"]  # type: ignore[index]


def test_attained_service_decays_with_its_half_life() -> None:
    ledger = Ledger(half_life_s=10.0)
    ledger.charge("a", 100.0, 0.0)
    assert ledger.standing("a", 10.0) == pytest.approx(50.0)
    ledger.charge("b", 50.0, 10.0)
    # Charged at different times, compared on their stored sums alone.
    assert ledger.stored("a") == pytest.approx(ledger.stored("b"))
    assert ledger.standing("a", 30.0) == pytest.approx(12.5)


def test_the_ledger_rebases_before_a_float_overflows() -> None:
    ledger = Ledger(half_life_s=1.0)
    ledger.charge("a", 100.0, 0.0)
    ledger.charge("b", 200.0, 0.0)
    ledger.charge("a", 1.0, 2000.0)
    assert ledger.epoch == 2000.0
    assert ledger.standing("a", 2000.0) == pytest.approx(1.0)
    assert ledger.stored("b") < ledger.stored("a")


def test_removing_a_queued_item_leaves_nothing_behind() -> None:
    queue: FairQueue[str] = FairQueue(Ledger(10.0))
    queue.push("x", Flow("a"), 0.0)
    queue.push("y", Flow("a", priority_class=2), 0.0)
    assert queue.remove("y") and queue.remove("x")
    assert not queue.remove("x")
    assert len(queue) == 0 and queue.depths() == {} and queue.pop() is None


def test_bad_queue_settings_are_named() -> None:
    problems = check_queueing(QueueSettings(max_queued=-1, max_queue_wait_s=0, half_life_s=-1))
    assert problems == [
        "max_queued must be >= 0",
        "max_queue_wait_s must be > 0",
        "half_life_s must be > 0",
    ]


def _slots(capacity: int, **settings: object) -> ModelSlots:
    return ModelSlots(
        "m",
        lambda: capacity,
        QueueSettings(**settings),  # type: ignore[arg-type]
        retry_after_s=3,
        clock=Clock(),
    )


async def test_a_free_slot_is_taken_at_once_without_a_queue_entry() -> None:
    slots = _slots(2)
    first = slots.try_acquire(Flow("a"), 10)
    second = await slots.acquire(Flow("a"), 10)
    assert first is not None and slots.in_flight == 2
    assert slots.try_acquire(Flow("a"), 10) is None and len(slots.queue) == 0
    slots.release(first, 10)
    slots.release(second, 10)
    assert slots.in_flight == 0


async def test_a_freed_slot_goes_to_the_least_served_tenant_waiting() -> None:
    slots = _slots(1)
    held = await slots.acquire(Flow("flood"), 100)
    order: list[str] = []

    async def wait(tenant: str) -> None:
        slot = await slots.acquire(Flow(tenant), 100)
        order.append(tenant)
        slots.release(slot, 100)

    tasks = [asyncio.create_task(wait(t)) for t in ("flood", "flood", "quiet")]
    await asyncio.sleep(0)
    assert slots.waiting() == 3
    slots.release(held, 100)
    await asyncio.gather(*tasks)
    assert order == ["quiet", "flood", "flood"]
    assert slots.in_flight == 0 and slots.waiting() == 0


async def test_a_tenant_over_its_queue_bound_gets_429() -> None:
    slots = _slots(1, max_queued=1)
    held = await slots.acquire(Flow("a"), 1)
    waiting = asyncio.create_task(slots.acquire(Flow("a"), 1))
    await asyncio.sleep(0)
    with pytest.raises(RateLimitError) as refused:
        await slots.acquire(Flow("a"), 1)
    assert refused.value.headers == {"Retry-After": "3"} and refused.value.code == "queue_full"
    with pytest.raises(RateLimitError):
        await slots.acquire(Flow("b", max_queued=0), 1)
    slots.release(held, 1)
    slots.release(await waiting, 1)


async def test_a_wait_that_ends_is_503_when_full_and_429_when_over_its_share() -> None:
    slots = _slots(1, max_queue_wait_s=0.01)
    held = await slots.acquire(Flow("a"), 1)
    with pytest.raises(ServiceUnavailableError) as full:
        await slots.acquire(Flow("b"), 1)
    assert full.value.headers == {"Retry-After": "3"} and full.value.code == "overloaded"
    # Both wait: a, served already, was over its share; c, the least served, found it full.
    over, late = await asyncio.gather(
        slots.acquire(Flow("a"), 1), slots.acquire(Flow("c"), 1), return_exceptions=True
    )
    assert isinstance(over, RateLimitError) and over.code == "queue_timeout"
    assert isinstance(late, ServiceUnavailableError) and late.code == "overloaded"
    slots.release(held, 1)
    assert slots.in_flight == 0 and slots.waiting() == 0


async def test_a_cancelled_wait_leaves_the_queue_and_a_granted_one_passes_its_slot_on() -> None:
    slots = _slots(1)
    held = await slots.acquire(Flow("a"), 1)
    leaving = asyncio.create_task(slots.acquire(Flow("b"), 1))
    await asyncio.sleep(0)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert slots.waiting() == 0
    granted = asyncio.create_task(slots.acquire(Flow("b"), 1))
    after = asyncio.create_task(slots.acquire(Flow("c"), 1))
    await asyncio.sleep(0)
    slots.release(held, 1)  # the slot goes to b, which leaves before it runs: c gets it
    granted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await granted
    slots.release(await after, 1)
    assert slots.in_flight == 0 and slots.waiting() == 0


async def test_with_the_queue_off_a_full_model_answers_503_at_once() -> None:
    slots = _slots(1, enabled=False)
    held = await slots.acquire(Flow("a"), 1)
    with pytest.raises(ServiceUnavailableError):
        await slots.acquire(Flow("b"), 1)
    slots.release(held, 1)


OBJECTIVES = {1: "llama-critical", 0: "llama-standard", -1: "llama-sheddable"}


@pytest.mark.parametrize(
    ("level", "objective"),
    [(2, "llama-critical"), (1, "llama-critical"), (0, "llama-standard"),
     (-1, "llama-sheddable"), (-5, None)],
)  # fmt: skip
def test_llm_d_headers_name_the_tenant_and_the_objective_of_its_class(
    level: int, objective: str | None
) -> None:
    headers = llm_d_headers(Flow("search", priority_class=level), OBJECTIVES)
    assert headers.pop(FAIRNESS_HEADER) == "search"
    assert headers == ({OBJECTIVE_HEADER: objective} if objective else {})


async def test_requests_to_an_inference_pool_carry_the_llm_d_headers() -> None:
    target = ModelTarget(url="pool:8001", triton_model="m", kind="tensorrt_llm")

    @dataclass(frozen=True)
    class Model:
        name: str
        routing: RoutingSettings
        target: ModelTarget
        replicas: None = None

    pooled = RoutingSettings(inference_pool=True, objectives=OBJECTIVES)
    router = Router([Model("pooled", pooled, target), Model("plain", RoutingSettings(), target)])
    backend = ScriptedBackend([TokenChunk("x", token_count=1)])
    request = GenerationRequest(
        "r", "hi", SamplingParams(max_tokens=1), stream=True, trace_headers={"traceparent": "t"}
    )
    assert router.preparer("plain", backend, target) is None
    prepare = router.preparer("pooled", backend, target)
    assert prepare is not None
    token = current_flow.set(Flow("search", priority_class=0))
    try:
        prepared = await prepare(request)
    finally:
        current_flow.reset(token)
    async for _ in prepared.stream():
        pass
    assert backend.requests[0].trace_headers == {
        "traceparent": "t",
        FAIRNESS_HEADER: "search",
        OBJECTIVE_HEADER: "llama-standard",
    }


async def test_waiters_take_the_slots_of_a_replica_that_comes_up_without_a_release() -> None:
    """Capacity that grows while requests wait (a replica up again, added by DNS) moves the
    queue at once, not at the next release or at the end of the waits."""
    target = ModelTarget(url="a:1", triton_model="m", kind="tensorrt_llm")
    endpoints = (ReplicaAddress("a", "a:1", None), ReplicaAddress("b", "b:1", None))

    @dataclass(frozen=True)
    class Model:
        name: str
        routing: RoutingSettings
        target: ModelTarget
        replicas: tuple[ReplicaAddress, ...]

    router = Router([Model("m", RoutingSettings(max_in_flight=1), target, endpoints)])
    pool, slots = router.pool("m"), router.slots("m")
    assert pool is not None and slots is not None
    pool.update(endpoints)
    pool.probed(pool.replicas["a"], True)
    held = await slots.acquire(Flow("a"), 1)
    waiting = [asyncio.create_task(slots.acquire(Flow(t), 1)) for t in ("b", "c")]
    await asyncio.sleep(0)
    assert slots.waiting() == 2
    pool.probed(pool.replicas["b"], True)
    await asyncio.sleep(0)
    granted = [task for task in waiting if task.done()]
    assert len(granted) == 1 and slots.waiting() == 1 and slots.in_flight == 2
    slots.release(held, 1)
    for task in waiting:
        slots.release(await task, 1)
    assert slots.in_flight == 0 and slots.waiting() == 0


async def test_pumping_a_full_model_grants_nothing_and_a_grown_one_its_new_slots() -> None:
    capacity = [1]
    slots = ModelSlots("m", lambda: capacity[0], QueueSettings(), clock=Clock())
    held = await slots.acquire(Flow("a"), 1)
    waiting = [asyncio.create_task(slots.acquire(Flow("b"), 1)) for _ in range(3)]
    await asyncio.sleep(0)
    slots.pump()
    assert slots.waiting() == 3 and slots.in_flight == 1
    capacity[0] = 3
    slots.pump()
    await asyncio.sleep(0)
    assert sum(task.done() for task in waiting) == 2 and slots.in_flight == 3
    slots.release(held, 1)
    for task in waiting:
        slots.release(await task, 1)
    assert slots.in_flight == 0 and slots.waiting() == 0
