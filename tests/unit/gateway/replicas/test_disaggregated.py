"""A disaggregated model's requests over the scripted backend: what runs split or whole, each
phase's outcome as its observer hears it, and the context replica's handoff released when no
generation phase takes it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from adapters.contract import (
    BackendUnavailable,
    GenerationRequest,
    InferenceFailed,
    ModelTarget,
    SamplingParams,
    TokenChunk,
)
from adapters.scripted import ScriptedBackend, Step
from gateway.replicas.disaggregated import DisaggregatedRequest, PhasePools
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.settings import RoutingSettings
from gateway.replicas.sources import ReplicaAddress

TARGET = ModelTarget(url="unused", triton_model="m", kind="tensorrt_llm")
HANDOFF = b"TPCP\x01{}"


def _pool(name: str, *urls: str) -> ReplicaPool:
    pool = ReplicaPool(name, TARGET, RoutingSettings(policy="round_robin"))
    pool.update([ReplicaAddress(f"{name}-{i}", url) for i, url in enumerate(urls)])
    for replica in pool.replicas.values():
        pool.probed(replica, True)
    return pool


def _pools() -> PhasePools:
    return PhasePools(_pool("m/context", "ctx:1"), _pool("m", "gen:1"), min_prompt_tokens=4)


def _request(
    ids: Sequence[int] = (1, 2, 3, 4), *, stream: bool = True, max_tokens: int = 3
) -> GenerationRequest:
    return GenerationRequest(
        request_id="r-0",
        prompt="p",
        params=SamplingParams(max_tokens=max_tokens),
        stream=stream,
        prompt_ids=tuple(ids),
    )


def _script(generation: Sequence[Step]) -> ScriptedBackend:
    def answer(request: GenerationRequest) -> Sequence[Step]:
        if request.phase == "context_only":
            return [TokenChunk("a", 1, final=True, context_phase_params=HANDOFF)]
        if request.phase == "generation_only":
            return generation
        return [TokenChunk("A", 1), TokenChunk("BC", 2, final=True)]

    return ScriptedBackend(answer)


class Heard:
    """A phase as its observer hears it."""

    def __init__(self, log: list[tuple[str, ...]], phase: str) -> None:
        self.log = log
        self.phase = phase

    def replica(self, name: str, address: str) -> None:
        self.log.append((self.phase, "replica", name))

    def failover(self, name: str, error: BaseException) -> None:
        self.log.append((self.phase, "failover", name))

    def trace_headers(self) -> dict[str, str]:
        return {"traceparent": f"span-of-{self.phase}"}

    def ended(self, outcome: str, error: BaseException | None = None) -> None:
        self.log.append((self.phase, "ended", outcome))


class Observer:
    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []
        self.handoffs = 0

    def replica(self, name: str, address: str) -> None:
        self.log.append(("whole", "replica", name))

    def failover(self, name: str, error: BaseException) -> None:
        self.log.append(("whole", "failover", name))

    def decided(self, model: str, decision: str) -> None:
        self.log.append((model, "decided", decision))

    def phase(self, model: str, phase: str) -> Heard:
        return Heard(self.log, phase)

    def handed_over(self, model: str, seconds: float) -> None:
        assert seconds >= 0
        self.handoffs += 1


async def _texts(prepared: DisaggregatedRequest) -> list[str]:
    return [chunk.text async for chunk in prepared.stream()]


async def test_a_split_request_is_heard_phase_by_phase() -> None:
    backend = _script([TokenChunk("b", 1), TokenChunk("c", 1, final=True)])
    observer = Observer()
    request = DisaggregatedRequest(_pools(), backend, _request(), observer)
    assert await _texts(request) == ["a", "b", "c"]
    assert observer.log == [
        ("m", "decided", "split"),
        ("context", "replica", "m/context-0"),
        ("context", "ended", "answered"),
        ("generation", "replica", "m-0"),
        ("generation", "ended", "answered"),
    ]
    assert observer.handoffs == 1
    # Each phase's Triton call carries its own span's context.
    assert [r.trace_headers["traceparent"] for r in backend.requests] == [
        "span-of-context",
        "span-of-generation",
    ]
    assert backend.released == []


async def test_a_whole_split_answer_has_no_handoff_time() -> None:
    backend = _script([TokenChunk("abc", 3, final=True)])
    observer = Observer()
    request = DisaggregatedRequest(_pools(), backend, _request(stream=False), observer)
    assert await _texts(request) == ["abc"]
    assert observer.log[-1] == ("generation", "ended", "answered")
    # Its generation phase answered once, at its end: no measure of the handoff.
    assert observer.handoffs == 0


@pytest.mark.parametrize(
    ("request_", "decision"),
    [
        (_request((1, 2, 3)), "whole_short_prompt"),
        (_request(()), "whole_no_prompt_ids"),
    ],
)
async def test_what_runs_whole_says_why(request_: GenerationRequest, decision: str) -> None:
    backend = _script([])
    observer = Observer()
    assert await _texts(DisaggregatedRequest(_pools(), backend, request_, observer)) == ["A", "BC"]
    assert observer.log == [("m", "decided", decision), ("whole", "replica", "m-0")]
    assert [r.phase for r in backend.requests] == [None]


async def test_a_lost_handoff_is_heard_and_released_then_the_request_runs_whole() -> None:
    backend = _script([InferenceFailed("the context engine holds no request")])
    observer = Observer()
    request = DisaggregatedRequest(_pools(), backend, _request(stream=False), observer)
    assert await _texts(request) == ["A", "BC"]
    assert ("generation", "ended", "handoff_lost") in observer.log
    assert observer.log[-1] == ("whole", "replica", "m-0")
    assert backend.released == [("ctx:1", HANDOFF)]


async def test_a_generation_failure_after_the_first_token_ends_in_band() -> None:
    backend = _script([BackendUnavailable("gone")])
    observer = Observer()
    request = DisaggregatedRequest(_pools(), backend, _request(), observer)
    chunks = request.stream()
    assert (await anext(chunks)).text == "a"
    with pytest.raises(BackendUnavailable):
        await anext(chunks)
    assert observer.log[-1] == ("generation", "ended", "ended_in_band")


async def test_a_client_gone_between_the_phases_frees_the_context_replicas_blocks() -> None:
    backend = _script([TokenChunk("b", 1), TokenChunk("c", 1, final=True)])
    backend.hung.add("gen:1")
    observer = Observer()
    chunks = DisaggregatedRequest(_pools(), backend, _request(), observer).stream()
    assert (await anext(chunks)).text == "a"
    waiting = asyncio.ensure_future(anext(chunks))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await chunks.aclose()
    assert backend.released == [("ctx:1", HANDOFF)]
    assert observer.log[-1] == ("generation", "ended", "cancelled")


async def test_a_first_token_that_ends_the_answer_releases_the_handoff() -> None:
    backend = _script([])
    request = DisaggregatedRequest(_pools(), backend, _request(max_tokens=1), Observer())
    assert await _texts(request) == ["a"]
    assert backend.released == [("ctx:1", HANDOFF)]
