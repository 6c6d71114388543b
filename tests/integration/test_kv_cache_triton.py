"""KV-cache reuse, chunked prefill and the block metrics of the torch engine in tritonserver, and
the cached prompt tokens the gateway reports for them (OpenAI's ``cached_tokens``)."""

from __future__ import annotations

import hashlib
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from deploy.sidecar.supervisor import Sidecar
from tests.support.engine_grpc import Stream, request, stop, tokens_of
from tests.support.gateway import (  # noqa: F401
    BLS_MODEL,
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    SYNC_ENSEMBLE_MODEL,
    LiveGateway,
    gateway_url,
    sidecar_settings,
)
from tests.support.prometheus import total, value
from tests.support.sidecars import CHUNK_TOKENS, SMALL_KV_CACHE

pytestmark = pytest.mark.slow

BLOCK = 32  # the tiny pipeline's tokens_per_block (the spec's default)
BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
SYSTEM = "You are a careful assistant who answers briefly. " * 12


def _prompt(seed: int, length: int) -> tuple[int, ...]:
    return tuple(int(t) for t in np.random.default_rng(seed).integers(100, 600, length))


def _scrape(sidecar: Sidecar) -> str:
    with urllib.request.urlopen(sidecar.metrics_url, timeout=10) as response:
        text: str = response.read().decode()
    return text


def _pool(sidecar: Sidecar, model: str) -> dict[str, float]:
    """The block gauges of one scrape that add up. The publisher sets them one after another,
    so a scrape can fall between two updates; the next one will not."""
    for _ in range(3):
        text = _scrape(sidecar)
        kinds = ("max", "free", "used", "reused", "tokens_per", "fraction")
        pool = {k: value(text, BLOCKS, model=model, kv_cache_block_type=k) for k in kinds}
        if pool["free"] + pool["used"] == pool["max"]:
            return pool
        time.sleep(0.05)
    raise AssertionError(f"free + used != max in three scrapes: {pool}")


def _engine_run(sidecar: Sidecar, prompt: tuple[int, ...], model: str, **extra: Any) -> Any:
    values = request(6, prompt, end_id=-1, exclude_input_in_output=True, **extra)
    ((outputs, _),) = [r for r in Stream(sidecar, values, model=model).collect() if r[0]]
    return outputs


def test_the_same_prompt_twice_reuses_its_blocks_with_the_same_tokens(sidecar: Sidecar) -> None:
    prompt = _prompt(1, 150)
    first = _engine_run(sidecar, prompt, "tiny_tensorrt_llm", return_perf_metrics=True)
    second = _engine_run(sidecar, prompt, "tiny_tensorrt_llm", return_perf_metrics=True)
    assert int(first["kv_cache_reused_blocks"][0, 0]) == 0
    assert int(second["kv_cache_reused_blocks"][0, 0]) == (len(prompt) - 1) // BLOCK
    assert int(second["kv_cache_alloc_total_blocks"][0, 0]) == 1  # only the last, partial one
    assert second["output_ids"].tolist() == first["output_ids"].tolist()


def _published(sidecar: Sidecar, model: str, check: Callable[[dict[str, float]], bool]) -> Any:
    """The first pool that passes ``check``: the engine publishes its statistics every 100 ms,
    so a change shows within a few of them."""
    deadline = time.monotonic() + 10
    pool = _pool(sidecar, model)
    while not check(pool):
        assert time.monotonic() < deadline, f"the block metrics never showed it: {pool}"
        time.sleep(0.05)
        pool = _pool(sidecar, model)
    return pool


def test_block_metrics_add_up_before_during_and_after_load(sidecar: Sidecar) -> None:
    model = "tiny_tensorrt_llm"
    before = _pool(sidecar, model)
    assert before["tokens_per"] == BLOCK and before["max"] > 0
    # Long enough to be running on any host when the metrics are read; stopped once they are.
    streams = [
        Stream(sidecar, request(2000, _prompt(100 + n, 70), streaming=True, end_id=-1))
        for n in range(6)
    ]
    try:
        for stream in streams:
            stream.next()
        # 70 prompt tokens and more: at least 3 blocks each.
        during = _published(sidecar, model, lambda pool: pool["used"] >= 6 * 3)
        assert during["fraction"] == pytest.approx(during["used"] / during["max"], abs=1e-6)
    finally:
        for stream in streams:
            stop(sidecar, stream.request_id)
            stream.collect()
    after = _published(sidecar, model, lambda pool: pool["used"] == 0)
    assert after["max"] == before["max"]


def test_chunked_prefill_streams_a_running_sequence_between_chunks(sidecar: Sidecar) -> None:
    """One batched request: a short streaming prompt and a long one. Its responses come in the
    engine's order, so they show how many decode steps ran while the long prompt prefilled."""
    long_prompt = _prompt(7, 10 * CHUNK_TOKENS)

    def tokens_before_long(model: str) -> int:
        short = _prompt(8, 5)
        ids = np.zeros((2, len(long_prompt)), np.int32)
        ids[0, : len(short)] = short
        ids[1] = long_prompt
        values = {
            "input_ids": ids,
            "input_lengths": np.array([[len(short)], [len(long_prompt)]], np.int32),
            "request_output_len": np.array([[60], [1]], np.int32),
            "streaming": np.array([[True], [True]]),
            "end_id": np.array([[-1], [-1]], np.int32),
        }
        count = 0
        for outputs, _ in Stream(sidecar, values, model=model).collect():
            if not outputs:
                continue
            if int(outputs["batch_index"][0, 0]) == 1:
                return count
            count += outputs["output_ids"].size
        raise AssertionError("the long prompt never answered")

    chunks = len(long_prompt) // CHUNK_TOKENS
    assert tokens_before_long("tiny2_tensorrt_llm") >= chunks - 2  # chunked context
    assert tokens_before_long("tiny_tensorrt_llm") <= 2  # one whole prefill


def test_eviction_under_a_small_cache_keeps_answers_correct(sidecar: Sidecar) -> None:
    """tiny3's cache holds two full-length sequences: five long prompts evict the oldest one's
    blocks (its tail first); answers stay the same whatever was evicted."""
    model = "tiny3_tensorrt_llm"
    prompts = [_prompt(200 + n, SMALL_KV_CACHE // 4 - 48) for n in range(5)]
    full = (len(prompts[0]) - 1) // BLOCK

    def answer(prompt: tuple[int, ...]) -> list[int]:
        return tokens_of(Stream(sidecar, request(4, prompt, end_id=-1), model=model).collect())

    def reused() -> float:
        # The engine publishes its statistics every 100 ms: read until two readings 0.3 s
        # apart agree.
        deadline, last = time.monotonic() + 10, None
        while True:
            time.sleep(0.3)
            now = _pool(sidecar, model)["reused"]
            if now == last or time.monotonic() > deadline:
                return now
            last = now

    answers = [answer(prompt) for prompt in prompts]
    before = reused()
    assert answer(prompts[0]) == answers[0]
    after_first = reused()
    assert after_first - before < full  # the oldest prompt lost blocks
    assert answer(prompts[-1]) == answers[-1]
    assert reused() - after_first == full  # the newest kept them all


# Through the gateway: usage.prompt_tokens_details.cached_tokens.

ENTRIES = [ENSEMBLE_MODEL, BLS_MODEL, ENGINE_MODEL, "tiny2-bls"]


@pytest.fixture(scope="module")
def http_gateway_url(sidecar: Sidecar, tiny_model_dir: Path) -> Iterator[str]:
    """A gateway serving the same models with ``transport: http``: streams go over Triton's
    HTTP ``generate_stream``."""
    gateway = LiveGateway(sidecar_settings(sidecar, tiny_model_dir, transport="http")).start()
    yield gateway.url
    gateway.stop()


@pytest.fixture(scope="module", params=["http", "grpc"])
def transport(request: pytest.FixtureRequest) -> str:
    """How the gateway streams from Triton: HTTP ``generate_stream`` or gRPC
    ``ModelStreamInfer``."""
    param: str = request.param
    return param


@pytest.fixture(scope="module")
def client(request: pytest.FixtureRequest, transport: str) -> Iterator[httpx.Client]:
    """A client of the gateway that streams over ``transport``."""
    url: str = request.getfixturevalue("http_gateway_url" if transport == "http" else "gateway_url")
    with httpx.Client(base_url=url, timeout=120) as client:
        yield client


def _chat(
    client: httpx.Client, model: str, question: str, stream: bool, system: str = SYSTEM
) -> tuple[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    if not stream:
        reply = client.post("/v1/chat/completions", json=body).json()
        return reply["choices"][0]["message"]["content"], reply["usage"]
    text, usage = "", None
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = httpx.Response(200, content=line[6:]).json()
            usage = chunk.get("usage") or usage
            text += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
    return text, usage


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("model", ENTRIES)
def test_a_repeated_chat_prompt_reports_cached_tokens(
    client: httpx.Client, transport: str, model: str, stream: bool
) -> None:
    # The prompt's first block is shared with no other test: a tag that differs from its start.
    tag = hashlib.blake2s(f"{transport} {model} {stream}".encode()).hexdigest()[:12]
    system = f"[{tag}] {SYSTEM}"
    first_text, first = _chat(client, model, "Why?", stream, system)
    second_text, second = _chat(client, model, "Why?", stream, system)
    assert second_text == first_text
    assert second["prompt_tokens"] == first["prompt_tokens"]  # billed in full either way
    block = 16 if model == "tiny2-bls" else BLOCK
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached == (second["prompt_tokens"] - 1) // block * block > 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_report_cached_tokens_too(
    client: httpx.Client, transport: str, stream: bool
) -> None:
    body: dict[str, Any] = {
        "model": ENSEMBLE_MODEL,
        "prompt": SYSTEM + f" Complete this ({transport} {stream}):",
        "max_tokens": 4,
        "temperature": 0,
    }
    client.post("/v1/completions", json=body)
    if not stream:
        usage = client.post("/v1/completions", json=body).json()["usage"]
    else:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        with client.stream("POST", "/v1/completions", json=body) as response:
            lines = [line for line in response.iter_lines() if '"usage":{' in line]
        usage = httpx.Response(200, content=lines[-1][6:]).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0


def test_a_release_without_reuse_stats_reports_no_details(client: httpx.Client) -> None:
    for _ in range(2):
        _, usage = _chat(client, SYNC_ENSEMBLE_MODEL, "Without details?", False)
    assert "prompt_tokens_details" not in usage


def test_cached_prompt_tokens_are_counted_per_model_and_tenant(client: httpx.Client) -> None:
    def counted() -> float:
        text = client.get("/metrics").text
        return total(text, "gateway_cached_prompt_tokens_total", model=ENSEMBLE_MODEL)

    before = counted()
    _chat(client, ENSEMBLE_MODEL, "Metric question?", False)
    _, usage = _chat(client, ENSEMBLE_MODEL, "Metric question?", False)
    assert counted() - before >= usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert 'tenant="' in client.get("/metrics").text.split("gateway_cached_prompt_tokens_total{")[1]
