"""Prompts a new user tries: empty, token ids, over-long, through a real tritonserver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from transformers import AutoTokenizer

from tests.support.gateway import BLS_MODEL, ENGINE_MODEL, ENSEMBLE_MODEL, gateway_url  # noqa: F401

pytestmark = pytest.mark.slow
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def client(gateway_url: str) -> Iterator[openai.OpenAI]:  # noqa: F811
    with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.mark.parametrize("model", [ENSEMBLE_MODEL, BLS_MODEL, ENGINE_MODEL])
@pytest.mark.parametrize("stream", [False, True])
def test_empty_prompt_is_answered_from_start_of_text(
    client: openai.OpenAI, model: str, stream: bool
) -> None:
    kwargs = {"model": model, "prompt": "", "max_tokens": 6, "temperature": 0, "echo": True}
    if stream:
        chunks = list(client.completions.create(**kwargs, stream=True))
        text = "".join(choice.text for chunk in chunks for choice in chunk.choices)
    else:
        answer = client.completions.create(**kwargs)
        assert answer.usage is not None and answer.usage.prompt_tokens >= 1
        assert answer.usage.completion_tokens == 6
        text = answer.choices[0].text
    assert text
    assert "<|" not in text  # the start token is not echoed


@pytest.mark.parametrize("model", [ENSEMBLE_MODEL, BLS_MODEL, ENGINE_MODEL])
def test_token_id_prompts_answer_as_their_text(
    client: openai.OpenAI, model: str, tiny_model_dir: Path
) -> None:
    ids = AutoTokenizer.from_pretrained(tiny_model_dir).encode(PROMPT)
    by_text = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage == by_text.usage
    several = client.completions.create(
        model=model, prompt=[ids, ids[:3]], max_tokens=4, temperature=0
    )
    assert [choice.index for choice in several.choices] == [0, 1]


def test_token_ids_outside_the_vocabulary_are_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=ENSEMBLE_MODEL, prompt=[1, 99_999_999], max_tokens=2)
    assert raised.value.body["param"] == "prompt[1]"  # type: ignore[index]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("request_type", "generation_only"),
        ("request_type", "context_and_generation"),
        ("context_phase_params", [84, 80, 67, 80, 1]),
        ("context_phase_params", None),
        ("disaggregated_params", {"request_type": "context_only"}),
    ],
)
def test_a_client_choosing_a_disaggregation_phase_is_a_400(
    client: openai.OpenAI, endpoint: str, field: str, value: object
) -> None:
    body = {"max_tokens": 2, "extra_body": {field: value}}
    with pytest.raises(openai.BadRequestError) as raised:
        if endpoint == "chat":
            messages = [{"role": "user", "content": PROMPT}]
            client.chat.completions.create(model=ENGINE_MODEL, messages=messages, **body)  # type: ignore[arg-type]
        else:
            client.completions.create(model=ENGINE_MODEL, prompt=PROMPT, **body)  # type: ignore[arg-type]
    assert raised.value.status_code == 400
    error = raised.value.body
    assert isinstance(error, dict)
    assert error["param"] == field
    assert "the gateway decides where each phase" in error["message"]
