"""The Triton adapter runs the two phases of a disaggregated request between two real
tritonservers (the tiny model's torch engine on the CPU): the context phase on one answers its
first token and the handoff, the generation phase on the other continues from it."""

from __future__ import annotations

import dataclasses
import functools
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from adapters.contract import (
    GenerationRequest,
    InvalidRequest,
    ModelTarget,
    SamplingParams,
    TokenChunk,
)
from adapters.triton import TritonBackend
from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from tests.integration.test_triton_client import tiny_tokens
from tests.support.prometheus import read_until, value
from tests.support.sidecars import QUICK_STOP

pytestmark = pytest.mark.slow

ENGINE = "tiny_tensorrt_llm"
PROMPT = "The quick brown fox jumps over the lazy dog, and then it runs far away. " * 5
BLOCKS = "nv_trt_llm_kv_cache_block_metrics"


@contextmanager
def disaggregated_servers(
    tiny_model_dir: Path, work: Path, *names: str, **engine: Any
) -> Iterator[list[Sidecar]]:
    """Tritonservers called ``names`` (a context and a generation server by default), each
    serving the tiny model's engine (``engine`` overriding its settings)."""
    settings = {
        "kind": "torch",
        "model_dir": str(tiny_model_dir),
        "max_batch_size": 4,
        "tokens_per_block": 16,
        "guided_decoding": False,
        "kv_transfer_timeout_ms": 60000,
        **engine,
    }
    spec = parse_spec(
        {
            "models": [{"name": "tiny", "release": "latest", "engine": settings}],
            "sidecars": [
                {"name": name, "keep_responses": False, **QUICK_STOP}
                for name in names or ("context", "generation")
            ],
        }
    )
    started = [sidecar_from_spec(spec, sidecar, work) for sidecar in spec.sidecars]
    try:
        for server in started:
            server.start()
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A context server and a generation server, each serving the tiny model's engine."""
    with disaggregated_servers(tiny_model_dir, tmp_path_factory.mktemp("disagg-backend")) as both:
        yield both


def _target(server: Sidecar, transport: str) -> ModelTarget:
    http = server.http_url if transport == "http" else None
    return ModelTarget(url=server.grpc_url, triton_model=ENGINE, kind="tensorrt_llm", http_url=http)


def _request(stream: bool, max_tokens: int = 12, **fields: Any) -> GenerationRequest:
    tokens = tiny_tokens()
    return GenerationRequest(
        request_id="disagg",
        prompt=PROMPT,
        params=SamplingParams(max_tokens=max_tokens, top_k=1, seed=0),
        stream=stream,
        prompt_ids=tokens._prompt(PROMPT).ids,
        tokens=tokens,
        **fields,
    )


async def _chunks(
    backend: TritonBackend, target: ModelTarget, request: GenerationRequest
) -> list[TokenChunk]:
    return [chunk async for chunk in backend.generate(target, request)]


async def _context(
    backend: TritonBackend, server: Sidecar, transport: str, stream: bool
) -> TokenChunk:
    chunks = await _chunks(
        backend, _target(server, transport), _request(stream, phase="context_only")
    )
    (chunk,) = [chunk for chunk in chunks if chunk.token_count]
    assert chunk.token_count == 1 and chunk.context_phase_params is not None
    return chunk


@pytest.mark.parametrize("transport", ["grpc", "http"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_the_two_phases_answer_what_the_whole_request_answers(
    servers: Any, transport: str, stream: bool
) -> None:
    context, generation = servers
    async with TritonBackend() as backend:
        whole = await _chunks(backend, _target(generation, transport), _request(stream))
        first = await _context(backend, context, transport, stream)
        handoff = first.context_phase_params
        request = _request(stream, phase="generation_only", context_phase_params=handoff)
        rest = await _chunks(backend, _target(generation, transport), request)
    expected = "".join(chunk.text for chunk in whole)
    if stream:
        # A streamed generation phase does not repeat the first token.
        assert first.text + "".join(chunk.text for chunk in rest) == expected
        assert 1 + sum(chunk.token_count or 0 for chunk in rest) == 12
    else:
        assert "".join(chunk.text for chunk in rest) == expected
        assert sum(chunk.token_count or 0 for chunk in rest) == 12


async def test_a_handoff_is_taken_once(servers: Any) -> None:
    context, generation = servers
    async with TritonBackend() as backend:
        first = await _context(backend, context, "grpc", False)
        request = _request(
            False, phase="generation_only", context_phase_params=first.context_phase_params
        )
        await _chunks(backend, _target(generation, "grpc"), request)
        with pytest.raises(Exception, match="holds no request") as caught:
            await _chunks(backend, _target(generation, "grpc"), request)
    assert not isinstance(caught.value, InvalidRequest)


def _used_blocks(server: Sidecar) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return value(text, BLOCKS, model=ENGINE, kv_cache_block_type="used")


async def test_a_generation_phase_given_up_is_stopped_at_its_engine(servers: Any) -> None:
    context, generation = servers
    async with TritonBackend() as backend:
        first = await _context(backend, context, "grpc", True)
        request = dataclasses.replace(
            _request(True, max_tokens=2000),
            phase="generation_only",
            context_phase_params=first.context_phase_params,
        )
        prepared = await backend.prepare(_target(generation, "grpc"), request)
        chunks = prepared.stream()
        assert (await anext(chunks)).token_count
        await chunks.aclose()
    for server in (context, generation):
        read_until(functools.partial(_used_blocks, server), lambda blocks: blocks == 0)
