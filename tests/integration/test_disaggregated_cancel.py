"""A client leaving a disaggregated request, through the gateway over two real tritonservers
(the tiny model's torch engine on the CPU): in the context phase the context engine drops it,
in the generation phase the generation engine stops it, and between the two the context engine
frees the prompt's blocks at once rather than after its ``kv_transfer_timeout_ms`` (a minute
here)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.queueing.settings import QueueSettings
from gateway.replicas.settings import DisaggregationSettings
from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.integration.test_disaggregated_backend import BLOCKS, ENGINE, PROMPT, servers
from tests.support.gateway import LiveGateway
from tests.support.prometheus import total, value
from tests.support.replica_gateway import FAST, endpoints

pytestmark = pytest.mark.slow
__all__ = ["servers"]

REQUESTS = "nv_trt_llm_request_metrics"
ITERATIONS = "nv_trt_llm_general_metrics"
DISAGG = "nv_trt_llm_disaggregated_serving_metrics"
LONG = 2000
"""Tokens of a long answer: thousands of engine iterations on the CPU, seconds of work."""


@pytest.fixture(scope="module")
def gateway(servers: Any, tiny_model_dir: Path) -> Iterator[str]:
    """``tiny-split`` over both servers; ``tiny-context`` and ``tiny-generation`` each whole on
    one of them, to keep it busy."""
    context, generation = servers

    def model(name: str, replicas: Sidecar, **routing: Any) -> ModelSettings:
        return ModelSettings(
            name=name,
            triton_model=ENGINE,
            entry="tensorrt_llm",
            tokenizer_dir=str(tiny_model_dir),
            replicas=endpoints([replicas]),
            # The engines' slots are full for seconds on a shared CPU: their probes may answer
            # late, which must not eject them.
            routing=msgspec.structs.replace(FAST, probe_timeout_s=10.0, probe_misses=50, **routing),
        )

    split = DisaggregationSettings(context_replicas=endpoints([context]), min_prompt_tokens=32)
    settings = Settings(
        models=(
            model("tiny-split", generation, disaggregation=split),
            model("tiny-context", context),
            model("tiny-generation", generation),
        ),
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


def _engine(server: Sidecar) -> str:
    return httpx.get(server.metrics_url, timeout=10).text


def _stat(text: str, family: str, kind: str) -> float:
    label = {
        REQUESTS: "request_type",
        BLOCKS: "kv_cache_block_type",
        ITERATIONS: "general_type",
        DISAGG: "disaggregated_serving_type",
    }[family]
    return value(text, family, model=ENGINE, **{label: kind})


async def _until(server: Sidecar, check: Callable[[str], bool], what: str) -> str:
    deadline = time.monotonic() + 30
    while not check(text := await asyncio.to_thread(_engine, server)):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)
    return text


def _body(model: str, prompt: str, tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }


async def _read(client: httpx.AsyncClient, body: dict[str, Any], pieces: int | None = None) -> int:
    """Stream ``body``'s answer; with ``pieces``, leave once that many pieces of text came."""
    seen = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"text":"' in line and '"text":""' not in line:
                seen += 1
                if pieces is not None and seen >= pieces:
                    return seen
    return seen


@asynccontextmanager
async def _busy(
    client: httpx.AsyncClient, model: str, server: Sidecar
) -> AsyncIterator[list[asyncio.Task[int]]]:
    """Every batch slot of ``server``'s engine (4) held by a long whole answer, until the end."""
    fillers = [asyncio.create_task(_read(client, _body(model, "The cat", 4000))) for _ in range(4)]
    try:
        await _until(server, lambda t: _stat(t, REQUESTS, "scheduled") == 4, "never full")
        assert not any(filler.done() for filler in fillers)
        yield fillers
    finally:
        for filler in fillers:
            filler.cancel()
        await asyncio.gather(*fillers, return_exceptions=True)
        await _until(server, lambda t: _stat(t, REQUESTS, "active") == 0, "fillers never ended")


def _phases(text: str, phase: str, outcome: str) -> float:
    return total(
        text, "gateway_disaggregated_phases_total", model="tiny-split", phase=phase, outcome=outcome
    )


async def test_a_client_leaving_in_the_context_phase_leaves_the_context_engine(
    gateway: str, servers: Any
) -> None:
    context, _ = servers
    async with httpx.AsyncClient(base_url=gateway, timeout=120) as client:
        before = _phases((await client.get("/metrics")).text, "context", "cancelled")
        async with _busy(client, "tiny-context", context) as fillers:
            split = asyncio.create_task(_read(client, _body("tiny-split", PROMPT, 8)))
            # The context phase waits in the full context engine's queue.
            await _until(context, lambda t: _stat(t, REQUESTS, "waiting") == 1, "never queued")
            split.cancel()
            await asyncio.gather(split, return_exceptions=True)
            text = await _until(context, lambda t: _stat(t, REQUESTS, "waiting") == 0, "kept")
            # It left the queue, not for a slot a finished request freed.
            assert not any(filler.done() for filler in fillers)
            assert _stat(text, REQUESTS, "scheduled") == 4
        metrics = (await client.get("/metrics")).text
    assert _phases(metrics, "context", "cancelled") == before + 1


async def test_a_client_leaving_in_the_generation_phase_stops_the_generation_engine(
    gateway: str, servers: Any
) -> None:
    _, generation = servers
    async with httpx.AsyncClient(base_url=gateway, timeout=120) as client:
        start = _stat(await asyncio.to_thread(_engine, generation), ITERATIONS, "iteration_counter")
        handoffs = _stat(await asyncio.to_thread(_engine, generation), DISAGG, "request_count")
        # The first piece came from the context phase, the next ones from the generation phase.
        assert await _read(client, _body("tiny-split", PROMPT, LONG), pieces=4) == 4
        # The engine's statistics showed the handoff, then the request's end.
        await _until(generation, lambda t: _stat(t, DISAGG, "request_count") > handoffs, "none")
        text = await _until(generation, lambda t: _stat(t, REQUESTS, "active") == 0, "running")
        # Stopped: far fewer engine iterations than the answer's tokens.
        assert _stat(text, ITERATIONS, "iteration_counter") - start < LONG / 2
        metrics = (await client.get("/metrics")).text
    assert _phases(metrics, "generation", "cancelled") >= 1


async def test_a_client_leaving_between_the_phases_frees_the_context_blocks_at_once(
    gateway: str, servers: Any
) -> None:
    context, generation = servers
    async with httpx.AsyncClient(base_url=gateway, timeout=120) as client:
        idle = await asyncio.to_thread(_engine, context)
        assert _stat(idle, BLOCKS, "used") == 0
        handoffs = _stat(idle, DISAGG, "request_count")
        async with _busy(client, "tiny-generation", generation):
            # The first token came from the context phase; the generation phase waits in the
            # full generation engine's queue, the context engine holding the prompt's blocks.
            body = _body("tiny-split", PROMPT, 8)
            async with client.stream("POST", "/v1/completions", json=body) as response:
                # Kept referenced: a line iterator left to the garbage collector closes the
                # response, and the client would leave too early.
                lines = response.aiter_lines()
                async for line in lines:
                    if '"text":"' in line:
                        break
                await _until(context, lambda t: _stat(t, BLOCKS, "used") > 0, "nothing held")
                await _until(generation, lambda t: _stat(t, REQUESTS, "waiting") == 1, "running")
                assert lines is not None
            text = await _until(context, lambda t: _stat(t, BLOCKS, "used") == 0, "held")
            # Freed, not taken: no handoff left the context engine.
            assert _stat(text, DISAGG, "request_count") == handoffs
            await _until(generation, lambda t: _stat(t, REQUESTS, "waiting") == 0, "queued")
