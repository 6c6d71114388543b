"""A context replica killed under load, through the gateway over three real tritonservers (two
context replicas, one generation replica; the tiny model's torch engine on the CPU): requests
in their context phase there move to the other context replica, and those whose handoff it held
run again whole; no request fails before its first token."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from gateway.queueing.settings import QueueSettings
from gateway.replicas.settings import DisaggregationSettings
from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.integration.test_disaggregated_backend import ENGINE, PROMPT, disaggregated_servers
from tests.support.engine_probe import EngineProcess
from tests.support.gateway import LiveGateway
from tests.support.prometheus import total
from tests.support.replica_gateway import FAST, endpoints

pytestmark = pytest.mark.slow

TOKENS = 160
"""Each answer's tokens: enough that the generation engine's four slots fill and requests wait
there between their phases, their handoffs held by the context replicas."""


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    work = tmp_path_factory.mktemp("disagg-failover")
    with disaggregated_servers(
        tiny_model_dir, work, "context-a", "context-b", "generation"
    ) as started:
        yield started


@pytest.fixture(scope="module")
def gateway(servers: Any, tiny_model_dir: Path) -> Iterator[str]:
    context_a, context_b, generation = servers

    def model(name: str, **routing: Any) -> ModelSettings:
        return ModelSettings(
            name=name,
            triton_model=ENGINE,
            entry="tensorrt_llm",
            tokenizer_dir=str(tiny_model_dir),
            replicas=endpoints([generation]),
            routing=msgspec.structs.replace(FAST, policy="round_robin", **routing),
        )

    split = DisaggregationSettings(
        context_replicas=endpoints([context_a, context_b]), min_prompt_tokens=32
    )
    settings = Settings(
        models=(model("tiny-whole"), model("tiny-split", disaggregation=split)),
        limits=LimitSettings(request_timeout_s=120.0, shutdown_grace_s=5.0),
        tenancy=TenancySettings(auth=False),
        queueing=QueueSettings(enabled=False),
    )
    gateway = LiveGateway(settings)
    gateway.start()
    try:
        gateway.wait_ready()
        yield gateway.url
    finally:
        gateway.stop()


def _context_answers(metrics: str) -> float:
    return total(
        metrics,
        "gateway_disaggregated_phases_total",
        model="tiny-split",
        phase="context",
        outcome="answered",
    )


def _body(model: str, number: int) -> dict[str, Any]:
    """A prompt of its own: the generation engine holds no prefix of it, so its generation
    phase needs the context replica's blocks."""
    return {
        "model": model,
        "prompt": f"Request {number}. {PROMPT}",
        "max_tokens": TOKENS,
        "min_tokens": TOKENS,
        "temperature": 0,
    }


async def test_a_context_replica_killed_between_the_phases_costs_no_request(
    gateway: str, servers: Any
) -> None:
    context_a, _, generation = servers
    # The engine's stub serves the handoffs: killed with its server, at once.
    stub = EngineProcess(context_a, ENGINE).pid
    generation_stub = EngineProcess(generation, ENGINE).pid
    async with httpx.AsyncClient(base_url=gateway, timeout=120) as client:
        answers: list[httpx.Response] = []
        streams: list[tuple[int, str]] = []
        stop = asyncio.Event()
        numbers = itertools.count()

        async def loop() -> None:
            while not stop.is_set():
                body = _body("tiny-split", next(numbers))
                answers.append(await client.post("/v1/completions", json=body))

        async def loop_once(_: int) -> None:
            body = _body("tiny-split", next(numbers))
            answers.append(await client.post("/v1/completions", json=body))

        async def streamed() -> None:
            while not stop.is_set():
                body = {**_body("tiny-split", next(numbers)), "stream": True}
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    streams.append((response.status_code, (await response.aread()).decode()))

        clients = [asyncio.create_task(loop()) for _ in range(6)]
        clients += [asyncio.create_task(streamed()) for _ in range(2)]
        while len(answers) < 6:
            assert not any(task.done() for task in clients)
            await asyncio.sleep(0.05)
        # The generation engine's stub paused: no generation phase takes a handoff, while four
        # more requests run their context phases on both context replicas in turn, so that
        # context-a dies holding handoffs: theirs, and those of the requests already waiting
        # for a generation slot (its server still answers the gateway's probes meanwhile).
        # The pause stays under a second: Triton's Python backend, having sent a stub a
        # request, gives it about a second to mark itself healthy (a thread of the stub does,
        # every 0.3 s) before it fails the request as "Stub process ... is not healthy". A
        # pause of 1.6 s on a busy machine cost 37 of 43 requests that way.
        before = _context_answers((await client.get("/metrics")).text)
        os.kill(generation_stub, signal.SIGSTOP)
        try:
            extra = [asyncio.create_task(loop_once(n)) for n in range(4)]
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.7):
                    while _context_answers((await client.get("/metrics")).text) < before + 4:
                        await asyncio.sleep(0.02)
            assert context_a.pid is not None
            os.kill(stub, signal.SIGKILL)
            os.killpg(context_a.pid, signal.SIGKILL)
        finally:
            os.kill(generation_stub, signal.SIGCONT)
        await asyncio.gather(*extra)
        served = len(answers)
        deadline = time.monotonic() + 60
        while len(answers) < served + 16:
            assert time.monotonic() < deadline, "requests stopped being answered"
            assert not any(task.done() for task in clients)
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*clients)
        metrics = (await client.get("/metrics")).text

    assert Counter(answer.status_code for answer in answers) == {200: len(answers)}
    for answer in answers:
        assert answer.json()["usage"]["completion_tokens"] == TOKENS
        assert answer.json()["choices"][0]["text"]
    # A stream fails only after its first token (in-band), or answers in full.
    for status, text in streams:
        assert status == 200 and text.rstrip().endswith("data: [DONE]")
        if '"error"' in text:
            assert text.index('"text"') < text.index('"error"')
    # Some lost their handoff with context-a: a whole answer ran again whole, a stream ended
    # in-band.
    lost = sum(
        total(
            metrics,
            "gateway_disaggregated_phases_total",
            model="tiny-split",
            phase="generation",
            outcome=outcome,
        )
        for outcome in ("handoff_lost", "ended_in_band")
    )
    assert lost >= 1
