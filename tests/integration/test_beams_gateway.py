"""vLLM's beam-search fields through the gateway with the openai SDK: the choices are the beams
of one search through our ensemble and BLS, decoupled and not; what cannot be honoured is a 400
naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.engine import beam_log_probs, beam_reference
from tests.support.gateway import (  # noqa: F401
    BLS_MODEL,
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    SYNC_BLS_MODEL,
    SYNC_ENSEMBLE_MODEL,
    gateway_url,
)

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time"
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def client(gateway_url: str) -> Iterator[openai.OpenAI]:  # noqa: F811
    with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def beams_of(tiny_model_dir: Path) -> Any:
    """transformers' beams of ``PROMPT``, decoded as the pipeline decodes them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tuple(tokenizer.encode(PROMPT))

    def beams(width: int) -> list[str]:
        found = beam_reference(model, prompt, width, MAX_TOKENS)
        return [tokenizer.decode(ids, skip_special_tokens=True) for ids in found]

    return beams


def _beams(client: openai.OpenAI, model: str, **extra: Any) -> Any:
    body = {"use_beam_search": True, **extra.pop("extra_body", {})}
    return client.completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, extra_body=body, **extra
    )


@pytest.mark.parametrize(
    "model", [ENSEMBLE_MODEL, BLS_MODEL, SYNC_ENSEMBLE_MODEL, SYNC_BLS_MODEL, ENGINE_MODEL]
)
def test_completion_choices_are_the_beams_best_first(
    client: openai.OpenAI, model: str, beams_of: Any
) -> None:
    reply = _beams(client, model, n=3)
    assert [choice.text for choice in reply.choices] == beams_of(3)
    assert [choice.index for choice in reply.choices] == [0, 1, 2]
    assert reply.usage is not None and reply.usage.completion_tokens == 3 * MAX_TOKENS


def test_the_engine_entry_answers_each_beams_log_probs(
    client: openai.OpenAI, tiny_model_dir: Path, beams_of: Any
) -> None:
    """Through ``tensorrt_llm`` the gateway has every beam's ids: each choice carries its own
    beam's log probs, as many as its tokens, equal to transformers' for that beam."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompt = tuple(AutoTokenizer.from_pretrained(tiny_model_dir).encode(PROMPT))
    expected = beam_log_probs(model, prompt, 3, MAX_TOKENS)
    reply = _beams(client, ENGINE_MODEL, n=3, logprobs=0)
    assert [choice.text for choice in reply.choices] == beams_of(3)
    for choice, probs in zip(reply.choices, expected, strict=True):
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        assert choice.logprobs.token_logprobs == pytest.approx(probs, abs=1e-4)
        assert len(choice.logprobs.tokens or []) == len(probs)
    chat = client.chat.completions.create(
        model=ENGINE_MODEL,
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=MAX_TOKENS,
        n=2,
        logprobs=True,
        extra_body={"use_beam_search": True},
    )
    sums = []
    for choice in chat.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert len(choice.logprobs.content) == MAX_TOKENS
        sums.append(sum(entry.logprob for entry in choice.logprobs.content))
    assert sums == sorted(sums, reverse=True) and sums[0] > sums[1]


def test_best_of_widens_the_search_and_usage_counts_every_beam(
    client: openai.OpenAI, beams_of: Any
) -> None:
    reply = _beams(client, ENSEMBLE_MODEL, n=2, extra_body={"best_of": 4})
    assert [choice.text for choice in reply.choices] == beams_of(4)[:2]
    assert reply.usage is not None and reply.usage.completion_tokens == 4 * MAX_TOKENS


def test_chat_beams_are_n_distinct_choices(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=BLS_MODEL,
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=MAX_TOKENS,
        n=2,
        extra_body={"use_beam_search": True, "length_penalty": 1.0, "early_stopping": True},
    )
    texts = [choice.message.content for choice in reply.choices]
    assert len(texts) == 2 and texts[0] != texts[1] and all(texts)


def test_chat_best_of_widens_the_search_and_neutral_sampling_values_pass(
    client: openai.OpenAI,
) -> None:
    def usage(**extra: Any) -> int:
        reply = client.chat.completions.create(
            model=BLS_MODEL,
            messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=MAX_TOKENS,
            n=1,
            **extra,
        )
        assert len(reply.choices) == 1 and reply.choices[0].message.content
        assert reply.usage is not None
        return reply.usage.completion_tokens

    alone = usage(extra_body={"use_beam_search": True})
    widened = usage(
        top_p=1.0, seed=5, extra_body={"use_beam_search": True, "best_of": 4, "top_k": -1}
    )
    assert widened > alone


@pytest.mark.parametrize(
    ("model", "extra", "param"),
    [
        (ENSEMBLE_MODEL, {"n": 5}, "n"),
        (ENSEMBLE_MODEL, {"n": 2, "extra_body": {"best_of": 5}}, "best_of"),
        (ENSEMBLE_MODEL, {"stream": True}, "stream"),
        (ENSEMBLE_MODEL, {"top_p": 0.5}, "top_p"),
        (ENSEMBLE_MODEL, {"extra_body": {"top_k": 5}}, "top_k"),
        (ENSEMBLE_MODEL, {"extra_body": {"early_stopping": "never"}}, "early_stopping"),
        (ENSEMBLE_MODEL, {"extra_body": {"early_stopping": False}}, "early_stopping"),
        (ENSEMBLE_MODEL, {"logprobs": 0}, "logprobs"),
        (BLS_MODEL, {"logprobs": 0}, "logprobs"),
    ],
)
def test_what_a_beam_search_cannot_honour_is_refused_naming_the_field(
    client: openai.OpenAI, model: str, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _beams(client, model, **extra)
    assert caught.value.status_code == 400
    assert caught.value.body is not None and caught.value.body.get("param") == param  # type: ignore[union-attr]


@pytest.mark.parametrize("field", ["length_penalty", "early_stopping"])
def test_beam_fields_without_use_beam_search_are_refused(client: openai.OpenAI, field: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(
            model=ENSEMBLE_MODEL,
            prompt=PROMPT,
            max_tokens=4,
            extra_body={field: 1.0 if field == "length_penalty" else True},
        )
    assert caught.value.body is not None and caught.value.body.get("param") == field  # type: ignore[union-attr]
