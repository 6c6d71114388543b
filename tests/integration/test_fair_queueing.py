"""Fair queueing in front of a full model, against a real tritonserver running the paced
load-test engine: each request holds its slot for a known number of paced tokens, so shares
and orders are compared, never milliseconds."""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.queueing.settings import QueueSettings
from gateway.tenancy import StoreSettings, TenantPolicy
from tests.support.paced_stack import (
    MODEL,
    Answer,
    Stack,
    completion,
    flood,
    paced_gateway,
    paced_sidecar,
    stream_one,
)
from tests.support.prometheus import total
from tests.support.redis_server import RedisServer
from tests.support.replicas import start_replicas, stop_replicas

pytestmark = pytest.mark.slow
SLOTS = 2
TOKEN_S = 0.01
WARM_UP = 2 * SLOTS
TENANTS = {
    policy.name: policy
    for policy in (
        TenantPolicy(name="flood"),
        TenantPolicy(name="quiet"),
        TenantPolicy(name="even-a"),
        TenantPolicy(name="even-b"),
        TenantPolicy(name="heavy", weight=3.0),
        TenantPolicy(name="light"),
        TenantPolicy(name="basic"),
        TenantPolicy(name="gold", priority_class=1),
        TenantPolicy(name="tight", max_queued=1),
        TenantPolicy(name="patient"),
        TenantPolicy(name="leaver"),
    )
}


@pytest.fixture(scope="module")
def sidecar(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    # The engine takes more streams than the gateway sends: the order is the gateway's.
    with paced_sidecar(
        tiny_model_dir, tmp_path_factory.mktemp("paced"), token_s=TOKEN_S, batch=16
    ) as server:
        yield server


@pytest.fixture(scope="module")
def stack(sidecar: Sidecar, tiny_model_dir: Path) -> Iterator[Stack]:
    queueing = QueueSettings(max_queue_wait_s=4.0, half_life_s=600.0)
    with paced_gateway(
        sidecar, tiny_model_dir, TENANTS, max_in_flight=SLOTS, queueing=queueing
    ) as running:
        yield running


def _client(stack: Stack) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=stack.url, timeout=120)


async def _until(condition: object, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)


async def test_a_quiet_tenant_beside_a_flood_gets_no_error_and_waits_one_request_at_most(
    stack: Stack,
) -> None:
    body = completion(20)
    async with _client(stack) as client:
        solo = [await stream_one(client, stack, "quiet", body) for _ in range(3)]
        until = asyncio.Event()
        flooded: list[Answer] = []
        flooding = asyncio.create_task(
            flood(client, stack, "flood", body, streams=6 * SLOTS, until=until, answers=flooded)
        )
        await _until(lambda: stack.slots().waiting() >= 4 * SLOTS, "the flood queued")
        scraped = (await client.get("/metrics", headers=stack.admin())).text
        beside = [await stream_one(client, stack, "quiet", body) for _ in range(4)]
        until.set()
        await flooding
    assert all(answer.status == 200 for answer in solo + beside + flooded)
    length = statistics.median(answer.ended - answer.started for answer in solo)
    ttft_solo = statistics.median(answer.ttft for answer in solo)
    ttft_beside = statistics.median(answer.ttft for answer in beside)
    # Served first whenever a slot frees, quiet waits for one running request at most.
    assert ttft_beside <= ttft_solo + length, (ttft_solo, ttft_beside, length)
    assert total(scraped, "gateway_model_saturation", model=MODEL) >= 3.0
    assert total(scraped, "gateway_queue_depth", model=MODEL, tenant="flood") >= 4 * SLOTS
    assert total(scraped, "gateway_queue_served_tokens_total", model=MODEL, tenant="quiet") > 0
    assert total(scraped, "gateway_model_slots", model=MODEL) == SLOTS


async def _shares(
    stack: Stack, tenants: tuple[str, str], count: int, streams: tuple[int, int]
) -> Counter[str]:
    """Of ``count`` requests both tenants' floods complete, after the first few (those sent
    before either tenant had been served), each tenant's number: all are the same size."""
    body = completion(10)
    until = asyncio.Event()
    answers: list[Answer] = []
    async with _client(stack) as client:
        floods = [
            flood(client, stack, tenant, body, streams=n, until=until, answers=answers)
            for tenant, n in zip(tenants, streams, strict=True)
        ]
        running = asyncio.gather(*floods)
        await _until(lambda: len(answers) >= WARM_UP + count, f"{count} answers")
        until.set()
        await running
    assert all(answer.status == 200 for answer in answers)
    first = sorted(answers, key=lambda answer: answer.ended)[WARM_UP : WARM_UP + count]
    return Counter(answer.tenant for answer in first)


async def test_two_equal_tenants_flooding_split_the_tokens_evenly(stack: Stack) -> None:
    # Three times as many streams do not buy even-a a larger share.
    served = await _shares(stack, ("even-a", "even-b"), 40, (6 * SLOTS, 2 * SLOTS))
    # Half of the window each, within two answers (two slots that end together may fall on
    # either side of its edge); served in the order sent, even-a would have three quarters.
    assert served["even-a"] / 40 == pytest.approx(0.5, abs=0.05), served


async def test_weights_three_to_one_split_the_tokens_three_to_one(stack: Stack) -> None:
    served = await _shares(stack, ("heavy", "light"), 80, (3 * SLOTS, 3 * SLOTS))
    # Three quarters of the window within four answers; unweighted, heavy would have half.
    assert served["heavy"] / 80 == pytest.approx(0.75, abs=0.05), served


async def test_a_higher_class_overtakes_the_requests_of_a_lower_one_queued_before_it(
    stack: Stack,
) -> None:
    # Held long enough for the queue to be set up on a loaded host, and a second longer than
    # each other, so that the slots free one at a time and the queue's order is the order of
    # the first tokens: two slots freed together start two queued requests together, whose first
    # tokens then come in either order (0.34 ms apart, the later-queued one first, once).
    short = completion(5)
    async with _client(stack) as client:
        holding = [
            asyncio.create_task(stream_one(client, stack, "basic", completion(300 + 100 * slot)))
            for slot in range(SLOTS)
        ]
        await _until(lambda: stack.slots().in_flight == SLOTS, "the slots taken")
        queued = [asyncio.create_task(stream_one(client, stack, "basic", short)) for _ in range(3)]
        await _until(lambda: stack.slots().waiting() == 3, "basic queued")
        lowered = asyncio.create_task(stream_one(client, stack, "gold", {**short, "priority": 0}))
        await _until(lambda: stack.slots().waiting() == 4, "gold's lowered request queued")
        gold = asyncio.create_task(stream_one(client, stack, "gold", short))
        await _until(lambda: stack.slots().waiting() == 5, "gold queued")
        raised = await client.post(
            "/v1/completions", json={**short, "priority": 2}, headers=stack.headers("gold")
        )
        answers = await asyncio.gather(*holding, *queued, lowered, gold)
    assert raised.status_code == 400 and raised.json()["error"]["param"] == "priority"
    assert all(answer.status == 200 for answer in answers)
    first_tokens = {id(answer): answer.first_token or 0.0 for answer in answers}
    gold_answer, lowered_answer = answers[-1], answers[-2]
    basics = answers[SLOTS : SLOTS + 3]
    assert all(first_tokens[id(gold_answer)] < first_tokens[id(b)] for b in basics)
    # Lowered to class 0, gold's other request waited its turn among the basic ones: it is
    # the least served there, so it went first of them, yet after the class-1 request.
    assert first_tokens[id(gold_answer)] < first_tokens[id(lowered_answer)]


async def test_bounded_waits_end_in_429_or_503_with_retry_after(stack: Stack) -> None:
    long = completion(600)
    async with _client(stack) as client:
        holding = [
            asyncio.create_task(stream_one(client, stack, "tight", long)) for _ in range(SLOTS)
        ]
        await _until(lambda: stack.slots().in_flight == SLOTS, "the slots taken")
        waiting = asyncio.create_task(stream_one(client, stack, "tight", completion(5)))
        await _until(lambda: stack.slots().waiting() == 1, "tight queued")
        over_bound = await stream_one(client, stack, "tight", completion(5))
        patient = asyncio.create_task(stream_one(client, stack, "patient", completion(5)))
        timed_out = await waiting
        full = await patient
        for task in holding:
            task.cancel()
        await asyncio.gather(*holding, return_exceptions=True)
    assert over_bound.status == 429 and over_bound.headers["retry-after"] == "2", over_bound
    assert '"queue_full"' in over_bound.body
    # tight, holding both slots, was over its share when its wait ended: 429; patient, who
    # had nothing, found the model full: 503.
    assert timed_out.status == 429 and '"queue_timeout"' in timed_out.body, timed_out
    assert full.status == 503 and '"overloaded"' in full.body, full
    assert full.headers["retry-after"] == "2"


async def test_a_client_that_leaves_while_queued_leaves_nothing_behind(stack: Stack) -> None:
    long = completion(300)
    async with _client(stack) as client:
        holding = [
            asyncio.create_task(stream_one(client, stack, "leaver", long)) for _ in range(SLOTS)
        ]
        await _until(lambda: stack.slots().in_flight == SLOTS, "the slots taken")
        leaving = asyncio.create_task(stream_one(client, stack, "leaver", completion(5)))
        await _until(lambda: stack.slots().waiting() == 1, "queued")
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        await _until(lambda: stack.slots().waiting() == 0, "the queue empty")
        assert stack.slots().in_flight == SLOTS
        held = await asyncio.gather(*holding)
    assert all(answer.status == 200 for answer in held)
    await _until(lambda: stack.slots().in_flight == 0, "every slot given back")


@pytest.fixture(scope="module")
def two_gateways(
    sidecar: Sidecar, tiny_model_dir: Path, redis_server: RedisServer
) -> Iterator[tuple[Stack, Stack]]:
    """Two gateways sharing one Redis store, as the workers of one gateway do."""
    store = StoreSettings(kind="redis", url=redis_server.url, prefix="fairq")
    tenants = {name: TenantPolicy(name=name) for name in ("everywhere", "one-place")}
    queueing = QueueSettings(half_life_s=600.0, sync_interval_s=0.05)
    with paced_gateway(
        sidecar, tiny_model_dir, tenants, max_in_flight=SLOTS, queueing=queueing, store=store
    ) as first:
        same = {"keys": first.keys, "admin_key": first.admin_key}
        with paced_gateway(
            sidecar,
            tiny_model_dir,
            tenants,
            max_in_flight=SLOTS,
            queueing=queueing,
            store=store,
            **same,  # type: ignore[arg-type]
        ) as second:
            yield first, second


async def test_shares_hold_across_gateways_sharing_the_store(
    two_gateways: tuple[Stack, Stack],
) -> None:
    """``everywhere`` floods both gateways, ``one-place`` only the second: the second, seeing
    what ``everywhere`` gets from the first, gives its slots to ``one-place``, so the two
    split the whole gateway's tokens evenly (each gateway by its own standings: 3 to 1)."""
    first, second = two_gateways
    body = completion(10)
    until = asyncio.Event()
    answers: list[Answer] = []
    count = 60
    async with _client(first) as one, _client(second) as two:
        running = asyncio.gather(
            flood(one, first, "everywhere", body, streams=3 * SLOTS, until=until, answers=answers),
            flood(two, second, "everywhere", body, streams=3 * SLOTS, until=until, answers=answers),
            flood(two, second, "one-place", body, streams=3 * SLOTS, until=until, answers=answers),
        )
        await _until(lambda: len(answers) >= 2 * WARM_UP + count, f"{count} answers")
        until.set()
        await running
    assert all(answer.status == 200 for answer in answers)
    window = sorted(answers, key=lambda answer: answer.ended)[2 * WARM_UP : 2 * WARM_UP + count]
    served = Counter(answer.tenant for answer in window)
    # Half each, within a tenth of the window: by each gateway's own standings alone,
    # ``one-place`` would get a quarter (15 of 60).
    assert served["one-place"] / count == pytest.approx(0.5, abs=0.1), served


@pytest.fixture(scope="module")
def two_replicas(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Sidecar]]:
    """Two tritonservers (127.0.0.1 and 127.0.0.2) with the paced engine."""
    paced = {"kind": "loadtest", "tokenizer_dir": str(tiny_model_dir), "token_s": TOKEN_S}
    sidecars = start_replicas(
        tiny_model_dir,
        tmp_path_factory.mktemp("fair-replicas"),
        ("127.0.0.1", "127.0.0.2"),
        (16, 16),
        engines={0: paced, 1: paced},
    )
    yield sidecars
    stop_replicas(sidecars)


async def test_a_quiet_tenant_and_equal_shares_hold_across_two_replicas(
    two_replicas: list[Sidecar], tiny_model_dir: Path
) -> None:
    """The slots of a pool are every routable replica's: one each here, two in all, which
    queue the floods as one model's."""
    tenants = {name: TenantPolicy(name=name) for name in ("flood", "quiet", "even-b")}
    with paced_gateway(two_replicas, tiny_model_dir, tenants, max_in_flight=1) as stack:
        await _until(lambda: stack.slots().capacity() == SLOTS, "both replicas up")
        body = completion(20)
        async with _client(stack) as client:
            solo = [await stream_one(client, stack, "quiet", body) for _ in range(3)]
            until = asyncio.Event()
            flooded: list[Answer] = []
            running = asyncio.gather(
                flood(client, stack, "flood", body, streams=6 * SLOTS, until=until,
                      answers=flooded),
                flood(client, stack, "even-b", body, streams=2 * SLOTS, until=until,
                      answers=flooded),
            )  # fmt: skip
            await _until(lambda: stack.slots().waiting() >= 4 * SLOTS, "the floods queued")
            beside = [await stream_one(client, stack, "quiet", body) for _ in range(4)]
            await _until(lambda: len(flooded) >= WARM_UP + 40, "40 answers")
            until.set()
            await running
        by_replica = stack.gateway.app.state.runtime.router.pool(MODEL).replicas
        routed = {name: replica.routed for name, replica in by_replica.items()}
    assert all(answer.status == 200 for answer in solo + beside + flooded)
    length = statistics.median(answer.ended - answer.started for answer in solo)
    ttft_solo = statistics.median(answer.ttft for answer in solo)
    ttft_beside = statistics.median(answer.ttft for answer in beside)
    assert ttft_beside <= ttft_solo + length, (ttft_solo, ttft_beside, length)
    window = sorted(flooded, key=lambda answer: answer.ended)[WARM_UP : WARM_UP + 40]
    served = Counter(answer.tenant for answer in window)
    assert served["flood"] / 40 == pytest.approx(0.5, abs=0.05), served
    assert all(count > 10 for count in routed.values()), routed


async def test_requests_waiting_for_a_pool_take_a_replica_that_comes_up_at_once(
    two_replicas: list[Sidecar], tiny_model_dir: Path
) -> None:
    """One replica of two is down (its tritonserver stopped) while a long request holds the
    other's one slot and another waits: once it answers its probes again, the waiting request is
    served there, before the long one ends and frees its slot."""
    tenants = {name: TenantPolicy(name=name) for name in ("flood", "quiet")}
    later = two_replicas[1].pid
    assert later is not None
    os.killpg(later, signal.SIGSTOP)
    try:
        with paced_gateway(two_replicas, tiny_model_dir, tenants, max_in_flight=1) as stack:
            pool = stack.gateway.app.state.runtime.router.pool(MODEL)
            up = [name for name, replica in pool.replicas.items() if replica.health.routable]
            assert up == [two_replicas[0].name] and stack.slots().capacity() == 1
            async with _client(stack) as client:
                long = asyncio.create_task(stream_one(client, stack, "flood", completion(600)))
                await _until(lambda: stack.slots().in_flight == 1, "the long request admitted")
                short = asyncio.create_task(stream_one(client, stack, "quiet", completion(5)))
                await _until(lambda: stack.slots().waiting() == 1, "the short request queued")
                os.killpg(later, signal.SIGCONT)
                answers = await asyncio.gather(short, long)
            served_later = pool.replicas[two_replicas[1].name].routed
    finally:
        os.killpg(later, signal.SIGCONT)
    assert [answer.status for answer in answers] == [200, 200], answers
    assert answers[0].ended < answers[1].ended, answers
    assert served_later == 1
