"""The official openai SDK, sync and async, against the gateway over a real tritonserver."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionTokenLogprob

from tests.support.gateway import (  # noqa: F401
    ACCUMULATING_BLS_MODEL,
    BLS_MODEL,
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    SYNC_BLS_MODEL,
    SYNC_ENSEMBLE_MODEL,
    gateway_url,
)

pytestmark = pytest.mark.slow
# tiny2 and tiny3 are deployed like releases without num_output_tokens (the gateway counts the
# log probs of the tokens instead); tiny3 is not decoupled (a stream is one chunk).
MODELS = [
    ENSEMBLE_MODEL,
    BLS_MODEL,
    ACCUMULATING_BLS_MODEL,
    SYNC_ENSEMBLE_MODEL,
    SYNC_BLS_MODEL,
    ENGINE_MODEL,
]
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def client(gateway_url: str) -> Iterator[openai.OpenAI]:  # noqa: F811
    with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture
async def async_client(gateway_url: str) -> openai.AsyncOpenAI:  # noqa: F811
    return openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("model", MODELS)
def test_chat(client: openai.OpenAI, model: str) -> None:
    answer = client.chat.completions.create(model=model, messages=HELLO, max_tokens=8, seed=1)
    assert answer.object == "chat.completion"
    assert answer.id.startswith("chatcmpl-")
    assert answer.model == model
    (choice,) = answer.choices
    assert choice.message.role == "assistant"
    assert choice.message.content
    usage = answer.usage
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert (choice.finish_reason, usage.completion_tokens) == ("length", 8)


@pytest.mark.parametrize("model", MODELS)
def test_streamed_chat_equals_the_whole_answer(client: openai.OpenAI, model: str) -> None:
    whole = client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=24, temperature=1.0, seed=7
    )
    stream = client.chat.completions.create(
        model=model,
        messages=HELLO,
        max_tokens=24,
        temperature=1.0,
        seed=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == []
    assert chunks[-1].usage == whole.usage
    finishes = [c.choices[0].finish_reason for c in chunks[:-1]]
    assert finishes[-1] == whole.choices[0].finish_reason
    assert finishes[:-1] == [None] * (len(finishes) - 1)
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == whole.choices[0].message.content
    assert {c.id for c in chunks} == {chunks[0].id}


def test_stream_without_include_usage_has_no_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=ENSEMBLE_MODEL, messages=HELLO, max_tokens=4, stream=True
    )
    assert all(chunk.usage is None and chunk.choices for chunk in stream)


@pytest.mark.parametrize("model", MODELS)
def test_completions_stream_and_whole(client: openai.OpenAI, model: str) -> None:
    whole = client.completions.create(model=model, prompt="The cat", max_tokens=16, seed=3)
    assert whole.object == "text_completion"
    assert whole.choices[0].finish_reason == "length"
    stream = client.completions.create(
        model=model,
        prompt="The cat",
        max_tokens=16,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    streamed = list(stream)
    assert "".join(c.choices[0].text for c in streamed[:-1]) == whole.choices[0].text
    assert streamed[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert streamed[-1].usage == whole.usage


def test_n_and_prompt_lists(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model=ENSEMBLE_MODEL, prompt=["The cat", "A dog"], n=2, max_tokens=6, seed=11
    )
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    texts = [c.text for c in answer.choices]
    assert texts[0] != texts[1]  # distinct seeds per choice
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 4 * 6


def test_n_is_reproducible_with_a_seed(client: openai.OpenAI) -> None:
    def texts() -> list[str | None]:
        answer = client.chat.completions.create(
            model=BLS_MODEL, messages=HELLO, n=3, max_tokens=6, seed=5
        )
        return [c.message.content for c in answer.choices]

    first = texts()
    assert len(set(first)) > 1
    assert texts() == first


def test_echo(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model=ENSEMBLE_MODEL, prompt="The cat", max_tokens=4, echo=True, seed=1
    )
    plain = client.completions.create(model=ENSEMBLE_MODEL, prompt="The cat", max_tokens=4, seed=1)
    assert answer.choices[0].text == "The cat" + plain.choices[0].text


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences_are_cut_like_openai(
    client: openai.OpenAI, model: str, stream: bool
) -> None:
    text = (
        client.completions.create(model=model, prompt="The cat", max_tokens=30, temperature=0)
        .choices[0]
        .text
    )
    stop = text[10:14]
    expected = text[: text.index(stop)]
    if stream:
        chunks = list(
            client.completions.create(
                model=model,
                prompt="The cat",
                max_tokens=30,
                temperature=0,
                stop=[stop, "never"],
                stream=True,
            )
        )
        got = "".join(c.choices[0].text for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        answer = client.completions.create(
            model=model, prompt="The cat", max_tokens=30, temperature=0, stop=stop
        )
        got, finish = answer.choices[0].text, answer.choices[0].finish_reason
    assert (got, finish) == (expected, "stop")


def test_logprobs_of_sampled_tokens(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model=ENSEMBLE_MODEL, messages=HELLO, max_tokens=5, temperature=0, logprobs=True
    )
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert len(logprobs.content) == 5
    assert "".join(t.token for t in logprobs.content) == answer.choices[0].message.content
    assert all(t.logprob <= 0 and t.top_logprobs == [] for t in logprobs.content)


def _stop_inside(text: str) -> tuple[str, str]:
    """A stop sequence taken from inside ``text`` (where tokens may be cut), and the text before
    it."""
    stop = text[10:14]
    return stop, text[: text.index(stop)]


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_after_a_stop_cut_spell_the_text(
    client: openai.OpenAI, stream: bool
) -> None:
    """Tokens, log probs and offsets describe the text returned, token for token, in each chunk
    and in all, and nothing of the stop sequence the engine went on to generate."""
    params: dict[str, Any] = {
        "model": ENSEMBLE_MODEL,
        "prompt": "The cat",
        "max_tokens": 30,
        "temperature": 0,
    }
    stop, expected = _stop_inside(client.completions.create(**params).choices[0].text)
    params |= {"stop": [stop], "logprobs": 0}
    if stream:
        choices = [chunk.choices[0] for chunk in client.completions.create(**params, stream=True)]
    else:
        choices = client.completions.create(**params).choices
    text, tokens, logprobs, offsets = "", [], [], []
    for choice in choices:
        if choice.logprobs is not None:
            assert "".join(choice.logprobs.tokens or []) == choice.text
            assert choice.logprobs.text_offset == [
                len(text) + len("".join((choice.logprobs.tokens or [])[:i]))
                for i in range(len(choice.logprobs.tokens or []))
            ]
            tokens += choice.logprobs.tokens or []
            logprobs += choice.logprobs.token_logprobs or []
            offsets += choice.logprobs.text_offset or []
        else:
            assert not choice.text
        text += choice.text
    assert (text, choices[-1].finish_reason) == (expected, "stop")
    assert "".join(tokens) == expected and tokens
    assert len(logprobs) == len(tokens) and all(lp <= 0 for lp in logprobs)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_after_a_stop_cut_spell_the_content(
    client: openai.OpenAI, stream: bool
) -> None:
    params: dict[str, Any] = {
        "model": ENSEMBLE_MODEL,
        "messages": HELLO,
        "max_tokens": 30,
        "temperature": 0,
    }
    stop, expected = _stop_inside(
        client.chat.completions.create(**params).choices[0].message.content or ""
    )
    params |= {"stop": [stop], "logprobs": True}
    pieces: list[tuple[str, list[ChatCompletionTokenLogprob]]] = []
    if stream:
        for chunk in client.chat.completions.create(**params, stream=True):
            (choice,) = chunk.choices
            content = choice.logprobs.content if choice.logprobs else None
            pieces.append((choice.delta.content or "", content or []))
    else:
        (whole,) = client.chat.completions.create(**params).choices
        assert whole.finish_reason == "stop" and whole.logprobs is not None
        pieces.append((whole.message.content or "", whole.logprobs.content or []))
    for text, content in pieces:
        assert "".join(token.token for token in content) == text
        assert all(bytes(token.bytes or []) == token.token.encode() for token in content)
    assert "".join(text for text, _ in pieces) == expected
    assert [t for _, content in pieces for t in content]


def test_extra_sampling_fields(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model=BLS_MODEL,
        messages=[{"role": "system", "content": "be brief"}, *HELLO],
        max_completion_tokens=5,
        user="someone",
        presence_penalty=0.5,
        frequency_penalty=0.5,
        top_p=0.9,
        extra_body={"top_k": 20, "repetition_penalty": 1.1, "min_tokens": 5, "not_a_field": 1},
    )
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 5


def test_errors_surface_as_sdk_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=HELLO)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=ENSEMBLE_MODEL, messages=HELLO, temperature=5)
    assert bad.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=ENSEMBLE_MODEL, prompt="x", max_tokens=10**6)
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=ENSEMBLE_MODEL, messages=HELLO, n=100)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_models(client: openai.OpenAI) -> None:
    assert sorted(m.id for m in client.models.list()) == sorted(MODELS)
    assert client.models.retrieve(BLS_MODEL).id == BLS_MODEL


async def test_async_chat_stream_and_completion(async_client: openai.AsyncOpenAI) -> None:
    async with async_client:
        stream = await async_client.chat.completions.create(
            model=BLS_MODEL,
            messages=HELLO,
            max_tokens=6,
            seed=2,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        whole = await async_client.chat.completions.create(
            model=BLS_MODEL, messages=HELLO, max_tokens=6, seed=2
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content
        assert chunks[-1].usage == whole.usage
        completion = await async_client.completions.create(
            model=ENSEMBLE_MODEL, prompt="The cat", max_tokens=3
        )
        assert completion.choices[0].finish_reason == "length"
        with pytest.raises(openai.NotFoundError):
            await async_client.completions.create(model="nope", prompt="x")


def test_a_connection_idle_past_the_clients_expiry_is_still_open(
    gateway_url: str,  # noqa: F811
) -> None:
    """httpx (under the SDK) keeps an idle connection for 5 s: the gateway keeps it longer, so a
    request never goes out on a connection the server is closing at that moment."""
    host, port = gateway_url.removeprefix("http://").split(":")
    request = f"GET /health/live HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for wait_s in (0.0, 5.5):
            time.sleep(wait_s)
            sock.sendall(request)
            assert sock.recv(4096).startswith(b"HTTP/1.1 200"), f"closed after {wait_s} s idle"
