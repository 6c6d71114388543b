"""Property-based tests of the pure translators: any JSON body is a request or an OpenAI error."""

from __future__ import annotations

import random
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.plan import Prompt
from gateway.core.stops import StopMatcher
from gateway.errors import APIError
from gateway.http.answers import decode_body
from gateway.openai.chat.plan import check_chat, output_rules, template_messages
from gateway.openai.completions.plan import check_completion
from gateway.openai.protocol import ChatCompletionRequest, CompletionRequest
from gateway.openai.sampling import (
    choice_seeds,
    resolve_max_tokens,
    response_guide,
    sampling_params,
)
from gateway.openai.sampling import given as given_value
from gateway.settings import SamplingDefaults
from gateway.tools import model_formats

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "response_format",
    "min_tokens",
    "top_k",
    "logit_bias",
    "echo",
    "best_of",
    "suffix",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "user",
]
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "robot"])},
    optional={"content": json_values, "name": st.text(max_size=5), "tool_calls": json_values},
)
bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8).flatmap(
    lambda fields: st.fixed_dictionaries(
        {
            "model": st.just("m"),
            "messages": st.lists(message, max_size=3),
            "prompt": st.one_of(st.text(max_size=8), st.lists(st.integers(0, 900), max_size=4)),
        },
    ).map(lambda base: {**base, **fields})
)


def _plan(request: Any) -> None:
    """What planning does without a tokenizer or a backend: checks, guides and parameters."""
    prompt = Prompt("x", 3)
    if isinstance(request, ChatCompletionRequest):
        check_chat(request, max_n=4)
        template_messages(request.messages)
        output_rules(request, *model_formats(None, None, TEMPLATE), takes_tools=False)
    else:
        check_completion(request, max_n=4)
    guide = response_guide(given_value(request.response_format))
    max_tokens = resolve_max_tokens(
        given_value(request.max_tokens), None, prompt, 64, prompt_param="prompt"
    )
    sampling_params(request, SamplingDefaults(), max_tokens=max_tokens, logprobs=False, guide=guide)


@SETTINGS
@given(body=bodies, kind=st.sampled_from([ChatCompletionRequest, CompletionRequest]))
def test_any_body_is_planned_or_refused_with_an_openai_error(
    body: dict[str, Any], kind: type
) -> None:
    try:
        request = decode_body(msgspec.json.encode(body), kind)
        _plan(request)
    except APIError as error:
        assert 400 <= error.status_code < 500
        envelope = msgspec.to_builtins(error.envelope())
        assert set(envelope["error"]) == {"message", "type", "param", "code"}


@SETTINGS
@given(raw=st.binary(max_size=64))
def test_any_bytes_decode_or_are_a_400(raw: bytes) -> None:
    try:
        decode_body(raw, ChatCompletionRequest)
    except APIError as error:
        assert error.status_code == 400


@SETTINGS
@given(
    text=st.text(alphabet="ab\n", max_size=40),
    stops=st.lists(st.text(alphabet="ab\n", min_size=1, max_size=3), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=6),
)
def test_stops_cut_the_same_whatever_the_chunking(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    whole = StopMatcher(tuple(stops))
    expected = whole.feed(text) + whole.flush()
    matcher = StopMatcher(tuple(stops))
    pieces, start = [], 0
    for cut in sorted(set(cuts)):
        pieces.append(text[start:cut])
        start = max(start, cut)
    pieces.append(text[start:])
    got = "".join(matcher.feed(piece) for piece in pieces) + matcher.flush()
    assert got == expected
    # Generation stops where a stop sequence first completes (of two ending together, the
    # longer one is cut): the engine checks its stop words as each token arrives.
    ends = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    first = min(ends)[1] if ends else None
    assert expected == (text if first is None else text[:first])


@SETTINGS
@given(seed=st.none() | st.integers(-(2**63), 2**64 - 1), n=st.integers(1, 16))
def test_choice_seeds_are_distinct(seed: int | None, n: int) -> None:
    seeds = choice_seeds(seed, n, random.Random(0))
    assert len(set(seeds)) == n


@SETTINGS
@given(
    requested=st.none() | st.integers(1, 10_000),
    prompt=st.integers(0, 5_000),
    limit=st.integers(1, 4_096),
)
def test_max_tokens_fit_the_window_or_are_refused(
    requested: int | None, prompt: int, limit: int
) -> None:
    try:
        tokens = resolve_max_tokens(requested, None, Prompt("p", prompt), limit, prompt_param="p")
    except APIError as error:
        assert error.code == "context_length_exceeded"
        assert (requested or 1) + prompt > limit
    else:
        assert 1 <= tokens <= limit - prompt
