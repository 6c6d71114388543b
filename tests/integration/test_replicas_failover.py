"""Replicas failing and full, through the gateway: every replica saturated, and a replica
killed under load (``tests/support/replica_gateway.py`` has the servers)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.replicas.pool import Replica
from tests.support.prometheus import parse
from tests.support.replica_gateway import (
    WORDS,
    Replicas,
    body,
    closed_loop,
    replica_gateway,
)
from tests.support.replicas import served

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def replicas(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    with replica_gateway(tiny_model_dir, adapters, tmp_path_factory.mktemp("replicas")) as running:
        yield running


async def test_every_replica_saturated_is_a_503_and_nothing_hangs(replicas: Replicas) -> None:
    finished: list[int] = []

    async def send(client: httpx.AsyncClient) -> httpx.Response:
        answer = await client.post("/v1/completions", json=body("tiny-limited", "river", 400))
        finished.append(answer.status_code)
        return answer

    async with httpx.AsyncClient(base_url=replicas.url, timeout=60) as client:
        answers = await asyncio.gather(*(send(client) for _ in range(8)))
        statuses = Counter(a.status_code for a in answers)
        assert statuses == {200: 4, 503: 4}, statuses
        # Refused at once, not queued behind the four taken: every 503 came before any answer.
        assert finished[:4] == [503] * 4, finished
        refused = [a for a in answers if a.status_code == 503]
        assert all(a.headers["retry-after"] == "2" for a in refused)
        assert all(a.json()["error"]["code"] == "overloaded" for a in refused)
        # The queue emptied: a new request is taken.
        again = await client.post("/v1/completions", json=body("tiny-limited", "river", 4))
        assert again.status_code == 200
        text = (await client.get("/metrics")).text
    assert 'gateway_model_overloaded_total{model="tiny-limited"} 4.0' in text


async def _stream(client: httpx.AsyncClient, model: str, tokens: int) -> tuple[int, str]:
    async with client.stream(
        "POST", "/v1/completions", json=body(model, "harbor meadow", tokens, stream=True)
    ) as response:
        text = "".join([chunk async for chunk in response.aiter_text()])
    return response.status_code, text


def _ejections(text: str, model: str, replica: str) -> dict[str, float]:
    """The replica's ejections so far, by reason."""
    return {
        labels["reason"]: number
        for name, labels, number in parse(text)
        if name == "gateway_replica_ejections_total"
        and (labels["model"], labels["replica"]) == (model, replica)
    }


def _up(text: str, model: str, replica: str) -> float | None:
    """The replica's ``gateway_replica_up``; None while the scrape does not list it."""
    found = [
        number
        for name, labels, number in parse(text)
        if name == "gateway_replica_up" and (labels["model"], labels["replica"]) == (model, replica)
    ]
    return found[0] if found else None


def _running_and_queued(replica: Replica) -> bool:
    """Whether the replica holds a request past its first token and one still waiting for it."""
    waiting = len(replica.waiting_first)
    return waiting >= 1 and replica.in_flight - waiting >= 1


async def test_a_replica_killed_under_load(replicas: Replicas) -> None:
    r4 = replicas.by_name()["r4"]
    async with httpx.AsyncClient(base_url=replicas.url, timeout=90) as client:
        ready_codes: list[int] = []
        stop = asyncio.Event()

        async def watch_readiness() -> None:
            while not stop.is_set():
                ready_codes.append((await client.get("/health/ready")).status_code)
                await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch_readiness())
        # Long streams on every replica of tiny-mixed (r4 runs one and queues the rest).
        streams = [asyncio.create_task(_stream(client, "tiny-mixed", 600)) for _ in range(9)]
        pool = replicas.router().pool("tiny-mixed")
        deadline = time.monotonic() + 20
        while pool.replicas["r4"].in_flight < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        # Short whole answers keep coming while r4 dies: none may fail.
        background = asyncio.create_task(
            closed_loop(
                client,
                lambda w, i: (body("tiny-mixed", f"{WORDS[w]}", 8), {}),
                clients=4,
                seconds=3,
            )
        )
        await asyncio.sleep(0.3)
        # Killed while r4 holds a stream with output (its batch is one stream, paced: 6 s of
        # tokens, so Triton is still producing it) and more queued without a token. Checked
        # and killed with nothing awaited between.
        deadline = time.monotonic() + 20
        while not _running_and_queued(pool.replicas["r4"]):
            assert time.monotonic() < deadline, "r4 never held a running and a queued request"
            await asyncio.sleep(0.01)
        assert r4.pid is not None
        os.killpg(r4.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _up((await client.get("/metrics")).text, "tiny-mixed", "r4") != 0.0:
            assert time.monotonic() < deadline, "r4 never ejected"
            await asyncio.sleep(0.02)
        # Ejected by what the kill caused (the broken streams' UNAVAILABLE, or the next probe,
        # every 0.25 s), not by the stall timer: within 2 s by construction.
        ejections = _ejections((await client.get("/metrics")).text, "tiny-mixed", "r4")
        assert ejections.get("unavailable", 0) + ejections.get("probe", 0) >= 1, ejections
        assert ejections.get("stalled", 0) == 0, ejections
        answers = await background
        results = await asyncio.gather(*streams)

        assert answers and {a.status_code for a in answers} == {200}
        broken = 0
        for status, text in results:
            assert status == 200
            assert text.rstrip().endswith("data: [DONE]")
            if '"error"' in text:
                broken += 1
                # In-band, after output had started.
                assert text.index('"text"') < text.index('"error"')
        assert broken >= 1  # the stream r4 was running
        # Those queued on r4 without a token yet went to another replica instead.
        metrics = (await client.get("/metrics")).text
        assert 'gateway_replica_retries_total{model="tiny-mixed",replica="r4"}' in metrics
        assert 'gateway_replica_retries_total{model="tiny-mixed",replica="r4"} 0.0' not in metrics

        # Taken back once its supervisor has restarted it.
        deadline = time.monotonic() + 60
        while _up((await client.get("/metrics")).text, "tiny-mixed", "r4") != 1.0:
            assert time.monotonic() < deadline, "r4 never taken back"
            await asyncio.sleep(0.2)
        stop.set()
        await watcher
        served_before = served(r4)
        await closed_loop(
            client, lambda w, i: (body("tiny-mixed", "stone", 2), {}), clients=3, each=4
        )
        assert served(r4) > served_before
    assert ready_codes and set(ready_codes) == {200}
