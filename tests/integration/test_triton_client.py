"""The Triton backend against a real tritonserver: generation, counts, cancellation and errors."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import numpy as np
import pytest

from adapters.contract import (
    Backend,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
    ModelTarget,
)
from adapters.scripted import ScriptedBackend
from adapters.triton import TritonBackend
from adapters.triton.grpc.stream import Channels, GrpcCall, infer_request
from adapters.triton.tensors import first_input
from adapters.triton.wire import WireTensor
from deploy.sidecar.ports import free_port
from deploy.sidecar.supervisor import Sidecar
from tests.support.protocols import mismatches, protocol_methods
from tests.support.triton_calls import (
    ENTRIES,
    PROMPT,
    TRANSPORTS,
    addressed,
    collect,
    greedy,
    target,
    tiny_tokens,
)

MODELS = [
    "tiny_ensemble",
    "tiny_tensorrt_llm_bls",
    "tiny2_tensorrt_llm_bls",
    "tiny_tensorrt_llm",
    "tiny2_tensorrt_llm",
]


@pytest.mark.parametrize("implementation", [TritonBackend, ScriptedBackend])
def test_backend_satisfies_the_contract(implementation: type) -> None:
    assert protocol_methods(Backend), "the contract declares the backend's methods"
    assert mismatches(implementation, Backend) == []


async def test_unreachable_server_is_unavailable_quickly() -> None:
    nowhere = ModelTarget(url=f"127.0.0.1:{free_port()}", triton_model="m", kind="ensemble")
    started = time.monotonic()
    async with TritonBackend() as backend:
        with pytest.raises(BackendUnavailable):
            await collect(backend, nowhere, greedy(4, stream=True))
        assert not await backend.is_ready(nowhere)
    assert time.monotonic() - started < 10.0


@pytest.mark.slow
async def test_unknown_model_is_not_found(sidecar: Sidecar) -> None:
    async with TritonBackend() as backend:
        with pytest.raises(ModelNotFound):
            await collect(backend, target(sidecar, "no_such_model"), greedy(4, stream=False))
        assert not await backend.is_ready(target(sidecar, "no_such_model"))
        assert await backend.is_ready(target(sidecar, "tiny_ensemble"))


@pytest.mark.slow
async def test_describe_discovers_the_rendered_models(sidecar: Sidecar) -> None:
    async with TritonBackend() as backend:
        ensemble = await backend.describe(target(sidecar, "tiny_ensemble"))
        bls = await backend.describe(target(sidecar, "tiny_tensorrt_llm_bls"))
        accumulating = await backend.describe(target(sidecar, "tiny2_tensorrt_llm_bls"))

    assert ensemble.is_ensemble
    assert ensemble.engine_model == "tiny_tensorrt_llm"
    assert ensemble.decoupled, "the ensemble inherits the engine's decoupled mode"
    assert first_input(ensemble, ("min_tokens", "min_length")) is not None
    assert (bls.decoupled, bls.accumulate_tokens) == (True, False)
    assert (accumulating.decoupled, accumulating.accumulate_tokens) == (True, True)
    assert bls.engine_model == "tiny_tensorrt_llm"
    assert accumulating.engine_model == "tiny2_tensorrt_llm"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
async def test_streamed_text_equals_non_streamed_text(
    sidecar: Sidecar, transport: str, model: str
) -> None:
    where = target(sidecar, model, transport)
    async with TritonBackend() as backend:
        whole = await collect(backend, where, greedy(24, stream=False))
        pieces = []
        async for chunk in backend.generate(where, addressed(where, greedy(24, stream=True))):
            pieces.append(chunk)
            if len(pieces) == 1:
                open_while_streaming = backend.open_http_connections
        described = await backend.describe(where)
        open_after = backend.open_http_connections
        # As the gateway sends it: with its own count of the prompt.
        own_count = tiny_tokens()._prompt(PROMPT).exact_count
        counted = dataclasses.replace(greedy(24, stream=True), prompt_tokens=own_count)
        counted_pieces = await collect(backend, where, counted)

    assert open_while_streaming == (transport == "http"), "an HTTP stream has its connection"
    assert open_after == 0, "a stream lets its connection go when it ends"
    assert [chunk.final for chunk in whole] == [True]
    assert [chunk.final for chunk in pieces] == [False] * (len(pieces) - 1) + [True]
    # Over either transport the replies that arrived while the reader was busy come as one
    # chunk, so a quick engine on a loaded machine may stream in one; the paced engine's test in
    # test_loadtest_engine checks that both pass on replies as they come.
    assert whole[0].text
    assert "".join(chunk.text for chunk in pieces) == whole[0].text
    # Counted by the engine, or (a release without counts) by the log probs of the tokens.
    assert whole[0].token_count == 24
    assert sum(chunk.token_count or 0 for chunk in pieces) == 24
    assert all(chunk.logprobs == () for chunk in whole + pieces), "nobody asked for them"
    if described.is_engine:
        # The gateway sent the ids: it knows how many.
        prompt_ids = tiny_tokens()._prompt(PROMPT).ids
        assert {chunk.prompt_tokens for chunk in whole + pieces} == {len(prompt_ids)}
    elif described.reports_input_tokens:
        assert whole[0].prompt_tokens == pieces[0].prompt_tokens
        # The gateway's count is the engine's, so the engine is not asked for it again.
        assert whole[0].prompt_tokens == own_count
        assert {chunk.prompt_tokens for chunk in counted_pieces} == {None}
        assert sum(chunk.token_count or 0 for chunk in counted_pieces) == 24
    else:
        assert described.counts_by_logprobs
        assert {chunk.prompt_tokens for chunk in whole + pieces} == {None}


@pytest.mark.slow
async def test_http_streams_one_after_another_go_on_one_kept_alive_connection(
    sidecar: Sidecar,
) -> None:
    """tritonserver keeps a generate_stream connection open after its stream: the next stream
    goes on it, also after a while idle, and nothing else stays open."""
    where = target(sidecar, "tiny_ensemble", "http")
    async with TritonBackend() as backend:
        texts = []
        for pause_s in (0.0, 0.0, 3.0):
            await asyncio.sleep(pause_s)
            chunks = await collect(backend, where, greedy(8, stream=True))
            texts.append("".join(chunk.text for chunk in chunks))
            assert chunks[-1].final and sum(chunk.token_count or 0 for chunk in chunks) == 8
            assert backend.open_http_connections == 0
            assert backend.idle_http_connections == 1, "the stream's connection is kept"
    assert len(set(texts)) == 1 and texts[0]


@pytest.mark.slow
async def test_http_streams_without_keep_alive_each_open_and_close_their_own_connection(
    sidecar: Sidecar,
) -> None:
    """``limits.triton_keep_alive_s: 0``: every stream is whole and nothing stays open."""
    where = target(sidecar, "tiny_ensemble", "http")
    async with TritonBackend(http_keep_alive_s=0) as backend:
        for _ in range(2):
            chunks = await collect(backend, where, greedy(8, stream=True))
            assert chunks[-1].final and sum(chunk.token_count or 0 for chunk in chunks) == 8
            assert backend.open_http_connections == 0
            assert backend.idle_http_connections == 0


@pytest.mark.slow
async def test_concurrent_requests_share_one_channel(sidecar: Sidecar) -> None:
    where = target(sidecar, "tiny_ensemble")
    async with TritonBackend() as backend:
        streams = await asyncio.gather(
            *(collect(backend, where, greedy(16, stream=True)) for _ in range(4))
        )
        channels = len(backend._clients)

    texts = {"".join(chunk.text for chunk in chunks) for chunks in streams}
    assert len(texts) == 1, "same greedy request, same text, whatever the interleaving"
    assert all(chunks[-1].final for chunks in streams)
    assert channels == 1


@pytest.mark.slow
async def test_request_options_reach_the_engine(sidecar: Sidecar) -> None:
    where = target(sidecar, "tiny_tensorrt_llm_bls")
    sampling: dict[str, Any] = {"top_k": None, "top_p": 1.0, "temperature": 1.5}
    async with TritonBackend() as backend:
        short = await collect(backend, where, greedy(3, stream=False))
        long = await collect(backend, where, greedy(12, stream=False))
        sampled = [
            (await collect(backend, where, greedy(12, stream=False, seed=seed, **sampling)))[0].text
            for seed in (1, 2, 3, 1)
        ]

    assert long[0].text.startswith(short[0].text)
    assert len(short[0].text) < len(long[0].text)
    assert len(set(sampled[:3])) > 1, "different seeds sample different text"
    assert sampled[3] == sampled[0], "the same seed samples the same text"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.slow
@pytest.mark.parametrize("model", ENTRIES)
@pytest.mark.parametrize("stream", [False, True])
async def test_logprobs_come_with_the_tokens(
    sidecar: Sidecar, transport: str, model: str, stream: bool
) -> None:
    async with TritonBackend() as backend:
        chunks = await collect(
            backend, target(sidecar, model, transport), greedy(6, stream=stream, logprobs=True)
        )

    values = [value for chunk in chunks for value in chunk.logprobs]
    assert len(values) == 6
    assert all(value <= 0.0 for value in values)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.slow
@pytest.mark.parametrize("model", ENTRIES)
@pytest.mark.parametrize("params", [{"max_tokens": 0}, {"temperature": -1.0}])
async def test_rejected_parameters_are_invalid_requests(
    sidecar: Sidecar, transport: str, model: str, params: dict[str, Any]
) -> None:
    options = dict(params)
    request = greedy(options.pop("max_tokens", 4), stream=False, **options)
    async with TritonBackend() as backend:
        with pytest.raises(InvalidRequest):
            await collect(backend, target(sidecar, model, transport), request)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.slow
async def test_a_refusal_tells_what_to_change_and_keeps_triton_s_words_as_detail(
    sidecar: Sidecar, transport: str
) -> None:
    request = greedy(4, stream=False, temperature=-1.0)
    async with TritonBackend() as backend:
        with pytest.raises(InvalidRequest) as caught:
            await collect(backend, target(sidecar, "tiny_ensemble", transport), request)
    said, detail = str(caught.value), caught.value.detail
    assert "tiny_ensemble" in detail
    for internal in ("tiny", "ensemble", request.request_id, '"error"', "data:", "tensorrt_llm"):
        assert internal not in said


async def test_a_grpc_request_of_8_mib_reaches_triton_whole(sidecar: Sidecar) -> None:
    """A request larger than one HTTP/2 frame may carry (LoRA weights can be) goes in frames
    within the server's frame size and flow-control windows: Triton reads all of it and
    answers, here with its refusal of the input it does not know."""
    padding = np.zeros((1, 1 << 21), np.int32)
    tensors = [
        WireTensor("input_ids", "INT32", np.array([[5, 7, 9]], np.int32)),
        WireTensor("input_lengths", "INT32", np.array([[3]], np.int32)),
        WireTensor("request_output_len", "INT32", np.array([[2]], np.int32)),
        WireTensor("padding", "INT32", padding),
    ]
    request = infer_request("tiny_tensorrt_llm", "big", tensors, ["output_ids"])
    assert request.ByteSize() > 8 << 20
    channels = Channels()
    call = GrpcCall(channels, sidecar.grpc_url, request, 30.0, {}, ["output_ids"])
    try:
        replies = await call.read()
    finally:
        call.cancel()
        await channels.close()
    assert replies is not None
    assert "padding" in (replies[0].error or ""), replies
