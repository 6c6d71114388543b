"""How a Triton call ends early, against a real tritonserver: its deadline, a stream closed or
its task cancelled. The engine stops generating, and Triton counts nothing in flight after."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from adapters.contract import BackendTimeout, TokenChunk
from adapters.triton import TritonBackend
from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from tests.support.engine_probe import EngineProcess
from tests.support.triton_calls import ENTRIES, LONG, TRANSPORTS, addressed, collect, greedy, target

DEADLINE_S = 0.3


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.slow
@pytest.mark.parametrize("model", ENTRIES)
async def test_deadline_raises_backend_timeout_and_frees_the_engine(
    sidecar: Sidecar, transport: str, model: str
) -> None:
    engine = EngineProcess(sidecar, "tiny_tensorrt_llm")
    # A deadline a small part of the generation's time on any host (``LONG`` tokens take
    # seconds): the engine is still generating when it passes.
    request = greedy(LONG, stream=False, min_tokens=LONG, timeout_s=DEADLINE_S)
    started = time.monotonic()
    async with TritonBackend() as backend:
        with pytest.raises(BackendTimeout):
            await collect(backend, target(sidecar, model, transport), request)
        elapsed = time.monotonic() - started
        await asyncio.sleep(0.5)
        after = await engine.busy_seconds(1.0)

    # gRPC's deadline is its own (grpc.aio turns the timeout into a wall-clock time, and its
    # timers may fire a few milliseconds early against this monotonic clock): the call ends at its
    # deadline, not before it by more than that.
    assert DEADLINE_S - 0.01 <= elapsed < 8.0
    assert after < 0.15, f"the engine kept generating after the deadline ({after:.2f} CPU s)"


async def abandon_after_three_chunks(chunks: AsyncGenerator[TokenChunk, None], how: str) -> Any:
    """Read three chunks, then return a coroutine that abandons the stream ``how``."""
    if how == "aclose":
        for _ in range(3):
            await anext(chunks)
        return chunks.aclose()
    seen = asyncio.Event()

    async def consume() -> None:
        async for _ in chunks:
            seen.set()

    task = asyncio.create_task(consume())
    await seen.wait()

    async def cancel() -> None:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    return cancel()


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "how"),
    [("tiny_ensemble", "aclose"), ("tiny_ensemble", "cancel"), ("tiny_tensorrt_llm_bls", "aclose"),
     ("tiny2_tensorrt_llm_bls", "cancel"), ("tiny_tensorrt_llm", "aclose"),
     ("tiny2_tensorrt_llm", "cancel")],
)  # fmt: skip
async def test_abandoning_the_stream_stops_the_engine(
    sidecar: Sidecar, transport: str, model: str, how: str
) -> None:
    """The ensemble needs the stop request (Triton 2.51 does not cancel its running step)."""
    engine = EngineProcess(sidecar, model.split("_", 1)[0] + "_tensorrt_llm")
    where = target(sidecar, model, transport)
    async with TritonBackend() as backend:
        chunks = backend.generate(
            where, addressed(where, greedy(LONG, stream=True, min_tokens=LONG))
        )
        abandon = await abandon_after_three_chunks(chunks, how)
        generating = await engine.busy_seconds(0.5)
        await abandon
        await asyncio.sleep(0.3)
        after = await engine.busy_seconds(1.0)
        follow_up = await collect(backend, where, greedy(4, stream=False))

    assert generating > 0.15, f"the engine was generating ({generating:.2f} CPU s)"
    assert after < 0.15, f"the engine kept generating after the stream closed ({after:.2f} CPU s)"
    assert follow_up[-1].final


@pytest.mark.slow
async def test_abandoned_ensemble_streams_leave_nothing_in_flight(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Triton 2.51 counts a cancelled running ensemble request in flight for good (its shutdown
    then waits out its exit timeout): every way of abandoning a stream, and its deadline, must
    avoid that."""
    # ``slow``: the paced load-test engine, its first token half a second or so after the
    # request (never sooner: the pace is a floor).
    slow = {"kind": "loadtest", "tokenizer_dir": str(tiny_model_dir), "token_s": 0.01,
            "prompt_token_s": 0.05}  # fmt: skip
    spec = parse_spec(
        {
            "models": [{"name": "tiny", "release": "latest",
                        "engine": {"kind": "torch", "model_dir": str(tiny_model_dir)}},
                       {"name": "slow", "release": "latest", "engine": slow}],
            "sidecars": [{"name": "graceful"}],
        }
    )  # fmt: skip
    server = sidecar_from_spec(spec, spec.sidecars[0], tmp_path)
    server.start()
    try:
        async with TritonBackend() as backend:
            for transport in TRANSPORTS:
                where = target(server, "tiny_ensemble", transport)
                for how in ("aclose", "cancel"):
                    chunks = backend.generate(where, greedy(LONG, stream=True, min_tokens=LONG))
                    await (await abandon_after_three_chunks(chunks, how))
                # Left before Triton answered: the slow engine is still on the prompt.
                slow_where = target(server, "slow_ensemble", transport)
                waiting = asyncio.create_task(
                    anext(backend.generate(slow_where, greedy(LONG, stream=True)))
                )
                await asyncio.sleep(0.2)
                assert not waiting.done()
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                # Its deadline passes before the first token, then while tokens stream.
                for timeout_s, streamed in ((0.3, False), (2.0, True)):
                    chunks = backend.generate(
                        slow_where, greedy(LONG, stream=True, timeout_s=timeout_s)
                    )
                    seen = []
                    with pytest.raises(BackendTimeout):
                        async for chunk in chunks:
                            seen.append(chunk)
                    assert bool(seen) is streamed, (transport, timeout_s, len(seen))
    finally:
        server.stop()
    left = re.findall(r"Model '[^']+' \(version \d+\) has \d+ in-flight inferences",
                      server.log_path.read_text(errors="replace"))  # fmt: skip
    assert not left, left[0]
