"""A disaggregated model's requests over a context pool and a generation pool of real
tritonservers (the tiny model's torch engine on the CPU): the caller's answer is the aggregated
greedy answer, streamed and whole; short prompts run whole; a lost handoff runs whole again."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from adapters.contract import BackendError, BackendUnavailable, ModelTarget, TokenChunk
from adapters.triton import TritonBackend
from deploy.sidecar.ports import free_port
from deploy.sidecar.supervisor import Sidecar
from gateway.replicas.disaggregated import DisaggregatedRequest, PhasePools
from gateway.replicas.dispatch import PooledRequest
from gateway.replicas.pool import Replica, ReplicaPool
from gateway.replicas.settings import RoutingSettings
from gateway.replicas.sources import ReplicaAddress
from tests.integration.test_disaggregated_backend import ENGINE, _request, servers

pytestmark = pytest.mark.slow
__all__ = ["servers"]

TARGET = ModelTarget(url="unused", triton_model=ENGINE, kind="tensorrt_llm")


def _pool(name: str, *servers: Sidecar) -> ReplicaPool:
    pool = ReplicaPool(name, TARGET, RoutingSettings())
    pool.update(
        [ReplicaAddress(f"{name}-{i}", server.grpc_url) for i, server in enumerate(servers)]
    )
    for replica in pool.replicas.values():
        pool.probed(replica, True)
    return pool


def _pools(context: Sidecar, generation: Sidecar, min_prompt_tokens: int = 0) -> PhasePools:
    return PhasePools(_pool("context", context), _pool("generation", generation), min_prompt_tokens)


async def _answer(prepared: DisaggregatedRequest | PooledRequest) -> list[TokenChunk]:
    return [chunk async for chunk in prepared.stream()]


def _text(chunks: list[TokenChunk]) -> tuple[str, int]:
    return "".join(chunk.text for chunk in chunks), sum(chunk.token_count or 0 for chunk in chunks)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_the_split_answer_is_the_aggregated_greedy_answer(servers: Any, stream: bool) -> None:
    context, generation = servers
    pools = _pools(context, generation)
    request = dataclasses.replace(_request(stream), request_id=f"split-{stream}")
    async with TritonBackend() as backend:
        whole = await _answer(PooledRequest(pools.generation, backend, request))
        split = await _answer(DisaggregatedRequest(pools, backend, request))
    assert _text(split) == _text(whole)
    assert _text(split)[1] == 12
    assert split[-1].final
    assert all(chunk.context_phase_params is None for chunk in split)
    if stream:
        # The first token reached the caller on its own, from the context phase.
        assert split[0].token_count == 1 and not split[0].final


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_short_prompt_runs_whole_on_the_generation_pool(servers: Any, stream: bool) -> None:
    _, generation = servers
    request = _request(stream)
    # A context pool that nothing answers: a request sent there would fail.
    nowhere = ReplicaPool("context", TARGET, RoutingSettings())
    nowhere.update([ReplicaAddress("context-0", f"127.0.0.1:{free_port()}")])
    for replica in nowhere.replicas.values():
        nowhere.probed(replica, True)
    generating = _pool("generation", generation)
    async with TritonBackend() as backend:
        short = PhasePools(nowhere, generating, len(request.prompt_ids) + 1)
        answer = await _answer(DisaggregatedRequest(short, backend, request))
        assert _text(answer)[1] == 12
        with pytest.raises(BackendUnavailable):
            split = PhasePools(nowhere, generating, len(request.prompt_ids))
            await _answer(DisaggregatedRequest(split, backend, request))


async def test_a_lost_handoff_runs_the_request_whole(servers: Any) -> None:
    context, generation = servers
    pools = _pools(context, generation)
    request = _request(False)
    async with TritonBackend() as backend:
        whole = await _answer(PooledRequest(pools.generation, backend, request))

        class Lost(DisaggregatedRequest):
            """Hands over a handoff that another request took already."""

            async def _context(self) -> tuple[TokenChunk, Replica] | None:
                answered = await super()._context()
                assert answered is not None
                answer = answered[0]
                taken = dataclasses.replace(
                    request,
                    phase="generation_only",
                    context_phase_params=answer.context_phase_params,
                )
                await _answer(PooledRequest(pools.generation, backend, taken))
                return answered

        answer = await _answer(Lost(pools, backend, request))
        assert _text(answer) == _text(whole)
        streamed = dataclasses.replace(request, stream=True)
        with pytest.raises(BackendError, match="holds no request"):
            await _answer(Lost(pools, backend, streamed))


async def test_a_context_replica_that_fails_first_costs_the_request_nothing(
    servers: Any,
) -> None:
    context, generation = servers
    # The first context replica in turn answers nothing; the request moves to the other.
    pool = ReplicaPool("context", TARGET, RoutingSettings(policy="round_robin"))
    pool.update(
        [
            ReplicaAddress("context-gone", f"127.0.0.1:{free_port()}"),
            ReplicaAddress("context-live", context.grpc_url),
        ]
    )
    for replica in pool.replicas.values():
        pool.probed(replica, True)
    pools = PhasePools(pool, _pool("generation", generation))
    request = dataclasses.replace(_request(True), request_id="context-failover")
    async with TritonBackend() as backend:
        whole = await _answer(PooledRequest(pools.generation, backend, request))
        split = await _answer(DisaggregatedRequest(pools, backend, request))
    assert _text(split) == _text(whole)
    assert pool.replicas["context-gone"].retries == 1
    assert split[0].token_count == 1
