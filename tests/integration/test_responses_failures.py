"""A streamed response that fails once begun, read with the openai SDK through the gateway and a
real tritonserver: the engine is paced (a token every 10 ms) and the gateway's request deadline
one second, so the deadline passes mid-stream on any host. The stream ends with
``response.failed`` as OpenAI's does, the failed response is stored, and a whole request that
fails the same way answers the HTTP error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from agents import Agent, ModelBehaviorError, OpenAIResponsesModel, Runner, set_tracing_disabled

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from tests.support.gateway import LiveGateway, sidecar_settings
from tests.support.sidecars import QUICK_STOP

pytestmark = pytest.mark.slow
PACED = "paced"
PROMPT = "The cat sat on the mat."
# 5 s of tokens at the least: the one-second deadline passes mid-stream.
TOKENS = 500


@pytest.fixture(scope="module")
def paced_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sidecar]:
    paced = {"kind": "loadtest", "tokenizer_dir": str(tiny_model_dir), "token_s": 0.01}
    spec = parse_spec(
        {
            "models": [{"name": "paced", "release": "latest", "engine": paced}],
            "sidecars": [{"name": "paced", **QUICK_STOP}],
        }
    )
    server = sidecar_from_spec(spec, spec.sidecars[0], tmp_path_factory.mktemp("paced"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway_url(paced_sidecar: Sidecar, tiny_model_dir: Path) -> Iterator[str]:
    models = {PACED: ("paced_ensemble", "ensemble")}
    settings = sidecar_settings(paced_sidecar, tiny_model_dir, models=models, request_timeout_s=1.0)
    gateway = LiveGateway(settings).start()
    yield gateway.url
    gateway.stop()


@pytest.fixture(scope="module")
def client(gateway_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_a_stream_failing_mid_way_ends_with_response_failed_and_is_stored_failed(
    client: openai.OpenAI,
) -> None:
    events = list(
        client.responses.create(model=PACED, input=PROMPT, max_output_tokens=TOKENS, stream=True)
    )
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert any(event.type == "response.output_text.delta" for event in events)
    last = events[-1]
    assert last.type == "response.failed"
    assert [event.type for event in events].count("response.failed") == 1
    failed = last.response
    assert failed.status == "failed"
    assert failed.error is not None
    assert failed.error.code == "server_error"
    assert "The model did not finish within" in failed.error.message
    assert [(item.type, item.status) for item in failed.output] == [("message", "incomplete")]
    assert failed.output[0].content[0].text
    stored = client.responses.retrieve(failed.id)
    assert stored.status == "failed"
    assert stored.error == failed.error
    assert stored.output[0].content[0].text == failed.output[0].content[0].text


def test_the_stream_helper_yields_the_failure_and_has_no_final_response(
    client: openai.OpenAI,
) -> None:
    with client.responses.stream(model=PACED, input=PROMPT, max_output_tokens=TOKENS) as stream:
        types = [event.type for event in stream]
        assert types[-1] == "response.failed"
        # What the helper does when OpenAI's stream fails: no completed response to give.
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            stream.get_final_response()


def test_a_whole_response_failing_the_same_way_answers_the_http_error(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.responses.create(model=PACED, input=PROMPT, max_output_tokens=TOKENS)
    assert caught.value.status_code == 504
    assert caught.value.code == "timeout"


async def test_an_agent_streaming_a_failing_response_raises_its_error(gateway_url: str) -> None:
    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0)
    agent: Agent[None] = Agent(
        name="slow", model=OpenAIResponsesModel(model=PACED, openai_client=client)
    )
    streamed = Runner.run_streamed(agent, PROMPT, max_turns=1)
    with pytest.raises(ModelBehaviorError, match=r"`response\.failed`") as caught:
        async for _ in streamed.stream_events():
            pass
    assert "The model did not finish within" in str(caught.value)
    await client.close()
