"""The gateway in front of the stock models of three TensorRT-LLM releases, our engine behind them.

Each release runs decoupled and not, in its own tritonserver, one after the other. Through the
stock `ensemble` and (where it loads) the stock BLS, the openai SDK must see what it sees from
OpenAI: whole and streamed answers that agree, stop sequences, `n`, seeds, usage, finish reasons.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import openai
import pytest

from gateway.tenancy.config import KeyEntry, TenancySettings, TenantPolicy
from gateway.tenancy.service import digest, new_key
from tests.support.engine import beam_texts
from tests.support.engine_probe import EngineProcess
from tests.support.gateway import LiveGateway
from tests.support.lora import peft_greedy
from tests.support.pipeline_calls import Stream, generate
from tests.support.stock import (
    BLS_LOADS,
    PYTHON_MODELS,
    STOCK_MODELS,
    imports_torch,
    start_stock_sidecar,
)
from tests.support.stock_stack import (
    LORA_RELEASES,
    TOKENS_PER_BLOCK,
    Records,
    Stack,
    stock_settings,
)

pytestmark = pytest.mark.slow

RELEASES = ("v0.8", "v0.11", "v0.19")
GUIDED_RELEASES = ("v0.19",)
REUSE_STATS_RELEASES = ("v0.19",)
"""Releases whose stock models return per-request KV reuse stats (``return_perf_metrics``)."""
STACKS = [(release, decoupled) for release in RELEASES for decoupled in (True, False)]
ENTRIES = ("ensemble", "bls")
MESSAGES = [{"role": "user", "content": "Write a short note about rivers."}]


@pytest.fixture(
    scope="module", params=STACKS, ids=[f"{r}-{'dec' if d else 'nodec'}" for r, d in STACKS]
)
def stack(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    adapters: dict[str, Path],
    text_env: Path,
) -> Iterator[Stack]:
    if not STOCK_MODELS.is_dir():
        pytest.skip(f"the stock models are not beside the checkout ({STOCK_MODELS})")
    release, decoupled = request.param
    workdir = tmp_path_factory.mktemp(f"stock-{release}-{decoupled}")
    sidecar = start_stock_sidecar(release, decoupled, tiny_model_dir, workdir, text_env=text_env)
    records = Records()
    logging.getLogger("adapters.triton.client").addHandler(records)
    settings = stock_settings(sidecar.grpc_url, tiny_model_dir, release, adapters["lora-a"])
    gateway = LiveGateway(settings).start()
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    try:
        yield Stack(release, decoupled, sidecar, gateway, client, records)
    finally:
        logging.getLogger("adapters.triton.client").removeHandler(records)
        client.close()
        gateway.stop()
        sidecar.stop()


def test_models_that_load_without_torch_run_in_the_text_environment(
    stack: Stack, text_env: Path
) -> None:
    stubs = EngineProcess.every(stack.sidecar)
    has_bls = BLS_LOADS[stack.release]
    python_models = {"preprocessing", "postprocessing", "tensorrt_llm"}
    assert set(stubs) == python_models | ({"tensorrt_llm_bls"} if has_bls else set())
    torch_free = {
        name
        for name in PYTHON_MODELS
        if name in stubs and not imports_torch(STOCK_MODELS / f"{stack.release}.0" / name)
    }
    assert {"preprocessing", "postprocessing"} <= torch_free
    assert ("tensorrt_llm_bls" in torch_free) == (has_bls and stack.release != "v0.19")
    for name, stub in stubs.items():
        assert (stub.environment() == text_env) == (name in torch_free), name
        assert stub.maps_torch() == (name not in torch_free), name


def _chat(stack: Stack, model: str, **params: Any) -> tuple[str, str, Any]:
    reply = stack.client.chat.completions.create(model=model, messages=MESSAGES, **params)
    choice = reply.choices[0]
    return choice.message.content or "", choice.finish_reason, reply.usage


def _chat_stream(stack: Stack, model: str, **params: Any) -> tuple[str, str, Any]:
    text, finish, usage = [], None, None
    for chunk in stack.client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        **params,
    ):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(text), finish or "", usage


@pytest.mark.parametrize("entry", ENTRIES)
def test_chat_streamed_equals_whole_with_usage(stack: Stack, entry: str) -> None:
    model = stack.model(entry)
    whole = _chat(stack, model, max_tokens=24, seed=11, temperature=1.0)
    streamed = _chat_stream(stack, model, max_tokens=24, seed=11, temperature=1.0)
    assert whole[0] and streamed == whole
    _, finish, usage = whole
    assert finish == "length"  # the tiny model never samples its end token
    assert usage.completion_tokens == 24
    assert usage.prompt_tokens > 5
    assert usage.total_tokens == usage.prompt_tokens + 24


@pytest.mark.parametrize("entry", ENTRIES)
def test_completions_streamed_equals_whole(stack: Stack, entry: str) -> None:
    model = stack.model(entry)
    params: dict[str, Any] = {"max_tokens": 16, "seed": 5, "top_p": 0.9}
    whole = stack.client.completions.create(model=model, prompt="Once upon a time", **params)
    pieces = [
        chunk.choices[0].text
        for chunk in stack.client.completions.create(
            model=model, prompt="Once upon a time", stream=True, **params
        )
        if chunk.choices
    ]
    assert whole.choices[0].text and "".join(pieces) == whole.choices[0].text
    assert whole.usage is not None and whole.usage.completion_tokens == 16


@pytest.mark.parametrize("entry", ENTRIES)
def test_temperature_zero_is_greedy_through_every_entry(stack: Stack, entry: str) -> None:
    """The stock BLS of v0.8 (and v0.11) drops `temperature`: greedy must arrive all the same."""
    model = stack.model(entry)
    greedy = _chat(stack, model, max_tokens=16, temperature=0.0)
    assert greedy[0] and _chat(stack, model, max_tokens=16, temperature=0.0) == greedy
    assert _chat_stream(stack, model, max_tokens=16, temperature=0.0) == greedy
    completion = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.0}
    whole = stack.client.completions.create(model=model, **completion).choices[0].text
    assert stack.client.completions.create(model=model, **completion).choices[0].text == whole
    # The model does sample otherwise, so repeating is the greedy decoding's doing.
    sampled = {_chat(stack, model, max_tokens=16, temperature=1.0, seed=s)[0] for s in (1, 2)}
    assert sampled - {greedy[0]}


@pytest.mark.parametrize("entry", ENTRIES)
def test_seed_reproduces_and_unseeded_requests_vary(stack: Stack, entry: str) -> None:
    model = stack.model(entry)
    first = _chat(stack, model, max_tokens=12, seed=3)[0]
    assert _chat(stack, model, max_tokens=12, seed=3)[0] == first
    assert len({_chat(stack, model, max_tokens=12)[0] for _ in range(3)}) > 1


@pytest.mark.parametrize("entry", ENTRIES)
def test_stop_sequences_end_the_answer_and_are_cut(stack: Stack, entry: str) -> None:
    model = stack.model(entry)
    text = _chat(stack, model, max_tokens=24, seed=21)[0]
    stop = text[8:11]
    assert len(stop) == 3
    cut, finish, usage = _chat(stack, model, max_tokens=24, seed=21, stop=[stop])
    assert finish == "stop"
    assert cut == text[: text.index(stop)]
    assert 0 < usage.completion_tokens <= 24


@pytest.mark.parametrize("entry", ENTRIES)
def test_n_choices_differ(stack: Stack, entry: str) -> None:
    model = stack.model(entry)
    reply = stack.client.chat.completions.create(
        model=model, messages=MESSAGES, n=3, max_tokens=12, seed=8
    )
    texts = [choice.message.content for choice in reply.choices]
    assert [choice.index for choice in reply.choices] == [0, 1, 2]
    assert len(set(texts)) == 3 and all(texts)
    assert reply.usage is not None and reply.usage.completion_tokens == 36


@pytest.mark.parametrize("entry", ENTRIES)
def test_lora_adapters_pass_through_the_stock_models(
    stack: Stack, entry: str, tiny_model_dir: Path, adapters: dict[str, Path]
) -> None:
    if stack.release not in LORA_RELEASES:
        pytest.skip(f"the stock {stack.release} ensemble and BLS have no LoRA inputs")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = "The quick brown fox"
    expected = tokenizer.decode(
        peft_greedy(tiny_model_dir, adapters["lora-a"], tokenizer.encode(prompt), 10)
    )
    model = f"{stack.model(entry)}-lora"
    params: dict[str, Any] = {"prompt": prompt, "max_tokens": 10, "temperature": 0.0}
    whole = stack.client.completions.create(model=model, **params).choices[0].text
    assert whole == expected
    if stack.decoupled:
        chunks = stack.client.completions.create(model=model, stream=True, **params)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == expected


@pytest.mark.parametrize("entry", ENTRIES)
def test_structured_output_and_tool_calls_through_the_stock_models(
    stack: Stack, entry: str
) -> None:
    """v0.19 passes the guide to the engine; older releases have no guided inputs: a 400."""
    model = stack.model(entry)
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["answer"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    tools = [{"type": "function", "function": {"name": "count", "parameters": schema}}]
    if stack.release not in GUIDED_RELEASES:
        with pytest.raises(openai.BadRequestError, match="needs guided decoding"):
            stack.client.chat.completions.create(
                model=model,
                messages=MESSAGES,
                response_format=fmt,  # type: ignore[arg-type]
            )
        return
    reply = stack.client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        response_format=fmt,  # type: ignore[arg-type]
        max_tokens=200,
        seed=4,
    )
    assert 0 <= json.loads(reply.choices[0].message.content or "")["answer"] <= 99
    called = stack.client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        tools=tools,  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        seed=4,
        stream=stack.decoupled,
    )
    if stack.decoupled:
        state = openai.lib.streaming.chat.ChatCompletionStreamState()
        for chunk in called:
            state.handle_chunk(chunk)  # type: ignore[arg-type]
        called = state.current_completion_snapshot  # type: ignore[assignment]
    (call,) = called.choices[0].message.tool_calls or []  # type: ignore[union-attr]
    assert call.function.name == "count"
    assert 0 <= json.loads(call.function.arguments)["answer"] <= 99


def test_a_model_without_a_seed_input_answers_unseeded_requests(stack: Stack) -> None:
    text, finish, usage = _chat(stack, "noseed", max_tokens=8)
    assert text and finish == "length" and usage.completion_tokens == 8
    with pytest.raises(openai.BadRequestError, match="seed"):
        _chat(stack, "noseed", max_tokens=8, seed=1)
    with pytest.raises(openai.BadRequestError, match="n > 1"):
        stack.client.chat.completions.create(model="noseed", messages=MESSAGES, n=2, max_tokens=4)


def test_the_stock_bls_is_named_at_start_up_as_unable_to_stop(stack: Stack) -> None:
    def warned() -> list[str]:
        return [m for m in stack.warnings.messages if "stock TensorRT-LLM BLS" in m]

    if not BLS_LOADS[stack.release]:
        assert warned() == []
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not warned():
        time.sleep(0.1)
    _chat(stack, "bls", max_tokens=2)
    _chat(stack, "ensemble", max_tokens=2)
    assert len(warned()) == 1, "one warning, at start-up"
    assert warned()[0].startswith("tensorrt_llm_bls at ") and "ensemble" in warned()[0]


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_repeated_prompt_reports_its_cached_tokens(stack: Stack, entry: str) -> None:
    """v0.19's stock models return the engine's reused blocks: the gateway reports them as
    cached prompt tokens, streamed and not. v0.8's and v0.11's examples turn reuse off and
    return no reuse stats: no details, and the engine reuses nothing."""
    model = stack.model(entry)
    system = f"[{entry}] " + "Answer every question with care and in few words. " * 8
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Why?"}]
    params: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 6}
    first = stack.client.chat.completions.create(temperature=0, **params)
    second = stack.client.chat.completions.create(temperature=0, **params)
    usage = [first.usage, second.usage]
    assert second.choices[0].message.content == first.choices[0].message.content
    assert usage[0] is not None and usage[1] is not None
    assert usage[0].prompt_tokens == usage[1].prompt_tokens  # billed in full
    streamed = None
    if stack.decoupled:
        chunks = stack.client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, temperature=0, **params
        )
        streamed = [chunk.usage for chunk in chunks if chunk.usage][-1]
    if stack.release not in REUSE_STATS_RELEASES:
        assert usage[1].prompt_tokens_details is None
        assert stack.engine_metric(BLOCKS, kv_cache_block_type="reused") == 0
        return
    assert usage[0].prompt_tokens_details is not None
    assert usage[1].prompt_tokens_details is not None
    cached = usage[1].prompt_tokens_details.cached_tokens
    assert usage[0].prompt_tokens_details.cached_tokens == 0
    assert cached == (usage[1].prompt_tokens - 1) // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK > 0
    if streamed is not None:
        assert streamed.prompt_tokens_details is not None
        assert streamed.prompt_tokens_details.cached_tokens == cached
    time.sleep(0.3)  # the engine publishes its statistics every 100 ms
    pool = {kind: stack.engine_metric(BLOCKS, kv_cache_block_type=kind) for kind in POOL}
    assert pool["reused"] >= cached // TOKENS_PER_BLOCK
    assert pool["free"] + pool["used"] == pool["max"]


BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
POOL = ("max", "free", "used", "reused")


def test_requests_share_engine_steps_and_a_dropped_request_frees_its_slot(stack: Stack) -> None:
    """Eight concurrent 48-token requests take about 48 engine iterations, not 8 x 48; a client
    that hangs up on a 2,000-token request has its generation stopped within a second."""
    if stack.decoupled:
        pytest.skip("the non-decoupled policy is the one whose batching is in question")
    steps = "nv_trt_llm_general_metrics"
    before = stack.engine_metric(steps, general_type="iteration_counter")
    threads = [
        threading.Thread(target=_chat, args=(stack, "ensemble"), kwargs={"max_tokens": 48})
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    time.sleep(0.3)
    iterations = stack.engine_metric(steps, general_type="iteration_counter") - before
    # Without in-flight batching this is 8 x 48 = 384 at least. Requests that reach the engine
    # apart add iterations (the stock preprocessing tokenizes them one after another): on a
    # two-core machine with the other test process beside it the spread has reached 158 steps
    # (206 iterations), so the bound is three quarters of serial.
    assert 47 <= iterations < 6 * 48
    assert _slot_freed_after_hangup(stack) < 1.0


def _active(stack: Stack) -> float:
    return stack.engine_metric("nv_trt_llm_request_metrics", request_type="active")


def _slot_freed_after_hangup(stack: Stack) -> float:
    body = (
        b'{"model": "ensemble", "max_tokens": 2000, '
        b'"messages": [{"role": "user", "content": "Tell me everything."}]}'
    )
    host, port = stack.gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        deadline = time.monotonic() + 30
        while _active(stack) < 1:
            assert time.monotonic() < deadline, "the long request never reached the engine"
            time.sleep(0.05)
    hung_up = time.monotonic()
    while _active(stack) > 0:
        assert time.monotonic() - hung_up < 10, "the abandoned generation kept running"
        time.sleep(0.02)
    return time.monotonic() - hung_up


BEAM_PROMPT = "Once upon a time"
BEAM_WIDTH = 3
BEAM_TOKENS = 10


@pytest.fixture(scope="module")
def stock_beams(tiny_model_dir: Path) -> list[str]:
    return beam_texts(tiny_model_dir, BEAM_PROMPT, BEAM_WIDTH, BEAM_TOKENS)


@pytest.mark.parametrize("entry", ENTRIES)
def test_beams_through_the_stock_models(stack: Stack, entry: str, stock_beams: list[str]) -> None:
    """v0.19's stock ensemble and BLS carry ``beam_width`` (and ``length_penalty``) to the
    engine: its beams are transformers', whole and, decoupled, streamed (each response every
    beam so far), straight to Triton and through the gateway. The older examples fill
    ``max_beam_width`` 1: the gateway refuses beams naming ``n``."""
    model = stack.model(entry)
    body = {"use_beam_search": True, "length_penalty": 1.0}
    if stack.release != "v0.19":
        with pytest.raises(openai.BadRequestError, match="max_beam_width is 1") as caught:
            stack.client.completions.create(
                model=model, prompt=BEAM_PROMPT, max_tokens=4, n=2, extra_body=body
            )
        assert caught.value.body is not None and caught.value.body.get("param") == "n"  # type: ignore[union-attr]
        return
    reply = stack.client.completions.create(
        model=model, prompt=BEAM_PROMPT, max_tokens=BEAM_TOKENS, n=BEAM_WIDTH, extra_body=body
    )
    assert [choice.text for choice in reply.choices] == stock_beams
    assert reply.usage is not None and reply.usage.completion_tokens == BEAM_WIDTH * BEAM_TOKENS
    values = {"text_input": BEAM_PROMPT, "max_tokens": BEAM_TOKENS, "beam_width": BEAM_WIDTH}
    whole = generate(stack.sidecar, stack.triton_model(entry), {**values, "return_log_probs": True})
    assert whole["status"] == 200, whole
    assert [text.removeprefix(BEAM_PROMPT) for text in whole["text_output"]] == stock_beams
    assert len(whole["cum_log_probs"]) == BEAM_WIDTH
    if not stack.decoupled:
        return
    arrays = {name: np.array([[value]]) for name, value in values.items()}
    arrays["max_tokens"] = arrays["max_tokens"].astype(np.int32)
    arrays["beam_width"] = arrays["beam_width"].astype(np.int32)
    arrays["stream"] = np.array([[True]])
    chunks = Stream(stack.sidecar, stack.triton_model(entry), arrays, f"beams-{entry}").collect()
    steps = [
        [bytes(text).decode() for text in chunk["text_output"].reshape(-1)]
        for chunk in chunks
        if "text_output" in chunk
    ]
    assert len(steps) == BEAM_TOKENS and all(len(step) == BEAM_WIDTH for step in steps)
    assert steps[-1] == stock_beams


REUSING_RELEASES = ("v0.19",)
"""Releases whose stock example fills ``enable_kv_cache_reuse`` true; v0.8's and v0.11's false."""


def test_tenants_of_a_stock_config_are_refused_or_share_only_by_the_operators_word(
    stack: Stack, tiny_model_dir: Path, adapters: dict[str, Path]
) -> None:
    """No stock config declares ``cache_salt_id``: with reuse on (v0.19) a tenant's request is
    refused, naming why, unless the model has ``shared_kv_cache``; with reuse off (v0.8, v0.11)
    there is no cache to share and every tenant is served."""
    keys = {name: new_key() for name in ("team-a", "team-b")}
    base = stock_settings(stack.sidecar.grpc_url, tiny_model_dir, stack.release, adapters["lora-a"])
    shared = msgspec.structs.replace(
        base.models[0], name="shared", shared_kv_cache=True, adapters=()
    )
    settings = msgspec.structs.replace(
        base,
        models=(base.models[0], shared),
        tenancy=TenancySettings(
            tenants=tuple(TenantPolicy(name=name) for name in keys),
            keys=tuple(KeyEntry(tenant=name, sha256=digest(key)) for name, key in keys.items()),
        ),
    )
    system = f"[{stack.release} scopes] " + "Answer every question with care and in few words. " * 8
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Why?"}]
    gateway = LiveGateway(settings).start()
    try:
        clients = {
            name: openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
            for name, key in keys.items()
        }

        def chat(tenant: str, model: str) -> Any:
            return clients[tenant].chat.completions.create(
                model=model, messages=messages, max_tokens=4, temperature=0
            )

        if stack.release not in REUSING_RELEASES:
            for tenant in keys:
                assert chat(tenant, "ensemble").choices[0].message.content
            return
        with pytest.raises(openai.BadRequestError, match="not configured to keep them apart"):
            chat("team-a", "ensemble")
        first, second = chat("team-a", "shared").usage, chat("team-b", "shared").usage
        assert first is not None and second is not None
        assert second.prompt_tokens_details is not None
        assert second.prompt_tokens_details.cached_tokens > 0  # shared, as the operator said
    finally:
        gateway.stop()
