"""LangChain's ChatOpenAI against the gateway: invoke, stream and batch, ensemble and BLS."""

from __future__ import annotations

import json

import httpx
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_openai import ChatOpenAI

from tests.support.gateway import BLS_MODEL, ENGINE_MODEL, ENSEMBLE_MODEL, gateway_url  # noqa: F401

pytestmark = pytest.mark.slow
QUESTION = "Tell me about the river."


@pytest.mark.parametrize("model", [ENSEMBLE_MODEL, BLS_MODEL, ENGINE_MODEL])
def test_invoke_stream_and_batch(gateway_url: str, model: str) -> None:  # noqa: F811
    sent: list[dict[str, object]] = []
    wire = httpx.Client(event_hooks={"request": [lambda r: sent.append(json.loads(r.read()))]})
    llm = ChatOpenAI(
        base_url=f"{gateway_url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        model=model,
        max_tokens=7,  # type: ignore[call-arg]
        temperature=0,
        max_retries=0,
        stream_usage=True,
        http_client=wire,
    )
    answer = llm.invoke(QUESTION)
    assert sent[0]["max_completion_tokens"] == 7
    assert isinstance(answer, AIMessage)
    assert isinstance(answer.content, str) and answer.content
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] == 7
    assert answer.response_metadata["finish_reason"] == "length"

    chunks = list(llm.stream(QUESTION))
    assert all(isinstance(chunk, AIMessageChunk) for chunk in chunks)
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.content == answer.content  # greedy: the same text streamed or not
    assert merged.usage_metadata == answer.usage_metadata

    batch = llm.batch([QUESTION, "What is a bridge?"])
    assert len(batch) == 2
    assert batch[0].content == answer.content
    assert isinstance(batch[1].content, str) and batch[1].content
    wire.close()
