"""The Triton backend against a real tritonserver: generation, counts, cancellation and errors."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
import time
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adapters.contract import (
    Backend,
    BackendTimeout,
    BackendUnavailable,
    EntryModel,
    GenerationRequest,
    InvalidRequest,
    ModelNotFound,
    ModelTarget,
    SamplingParams,
    TokenChunk,
)
from adapters.scripted import ScriptedBackend
from adapters.triton import TritonBackend
from adapters.triton.grpc.stream import Channels, GrpcCall, infer_request
from adapters.triton.tensors import first_input
from adapters.triton.wire import WireTensor
from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.models import ensure_tiny_model
from deploy.sidecar.ports import free_port
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from gateway.catalog.text.prompts import PromptTokenizer
from tests.support.engine_probe import EngineProcess
from tests.support.protocols import mismatches, protocol_methods

PROMPT = "def add(a, b):\n"
MODELS = [
    "tiny_ensemble",
    "tiny_tensorrt_llm_bls",
    "tiny2_tensorrt_llm_bls",
    "tiny_tensorrt_llm",
    "tiny2_tensorrt_llm",
]
ENTRIES = ["tiny_ensemble", "tiny_tensorrt_llm_bls", "tiny_tensorrt_llm"]
"""One model of each entry kind: the ensemble, the BLS, and the engine itself."""
LONG = 3000
"""Tokens a runaway generation would still produce: many seconds of engine work."""
DEADLINE_S = 0.3


TRANSPORTS = ["grpc", "http"]
"""gRPC ``ModelStreamInfer``, or HTTP ``generate_stream`` (the default where Triton's HTTP
address is known)."""


def target(sidecar: Sidecar, model: str, transport: str = "grpc") -> ModelTarget:
    kind: EntryModel = "tensorrt_llm_bls"
    if model.endswith("_ensemble"):
        kind = "ensemble"
    elif model.endswith("_tensorrt_llm"):
        kind = "tensorrt_llm"
    http = sidecar.http_url if transport == "http" else None
    return ModelTarget(url=sidecar.grpc_url, triton_model=model, kind=kind, http_url=http)


@functools.cache
def tiny_tokens() -> PromptTokenizer:
    """The tiny model's tokenizer, as the gateway loads it."""
    return PromptTokenizer.load(str(ensure_tiny_model()), ThreadPoolExecutor(1))


def addressed(where: ModelTarget, request: GenerationRequest) -> GenerationRequest:
    """The request with its token ids and tokenizer when it goes to the engine itself."""
    if where.kind != "tensorrt_llm":
        return request
    tokens = tiny_tokens()
    return dataclasses.replace(
        request, prompt_ids=tokens._prompt(request.prompt).ids, tokens=tokens
    )


def greedy(
    max_tokens: int, *, stream: bool, timeout_s: float = 60.0, **params: Any
) -> GenerationRequest:
    return GenerationRequest(
        request_id="test",
        prompt=PROMPT,
        params=SamplingParams(max_tokens=max_tokens, **{"top_k": 1, "seed": 0, **params}),
        stream=stream,
        timeout_s=timeout_s,
    )


async def collect(
    backend: TritonBackend, where: ModelTarget, request: GenerationRequest
) -> list[TokenChunk]:
    return [chunk async for chunk in backend.generate(where, addressed(where, request))]


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
