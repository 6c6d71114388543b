"""Translation of OpenAI request bodies into neutral generation requests."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest

from adapters.contract import SamplingParams
from gateway.catalog.registry import ServedModel, load_model
from gateway.core.plan import Prompt
from gateway.errors import ContextLengthExceeded, InvalidRequestError
from gateway.openai.chat.plan import check_chat, plan_chat, template_messages
from gateway.openai.completions.plan import check_completion
from gateway.openai.protocol import ChatCompletionRequest, CompletionRequest
from gateway.openai.sampling import (
    beam_choices,
    beam_search,
    choice_seeds,
    fan_out,
    resolve_max_tokens,
    sampling_params,
    stop_sequences,
)
from gateway.settings import SamplingDefaults
from tests.support.tiny_routes import tiny_route

USER = {"role": "user", "content": "hi"}


def chat(**fields: Any) -> ChatCompletionRequest:
    return msgspec.convert({"model": "m", "messages": [USER], **fields}, ChatCompletionRequest)


def completion(**fields: Any) -> CompletionRequest:
    return msgspec.convert({"model": "m", "prompt": "p", **fields}, CompletionRequest)


@pytest.mark.parametrize(
    ("requested", "default", "prompt_tokens", "limit", "cap", "expected"),
    [
        (None, None, 10, 100, None, 90),  # the rest of the window, never 16
        (None, 32, 10, 100, None, 32),
        (None, 500, 10, 100, None, 90),  # a configured default is capped by the window
        (5, None, 10, 100, None, 5),
        (90, None, 10, 100, None, 90),
        (5, 32, 10, 100, None, 5),
        (None, None, 10, 100, 50, 50),  # the caller's cap clamps the default
        (None, 32, 10, 100, 50, 32),
        (None, None, 95, 100, 50, 5),  # ...and the window still does
        (None, 500, 10, 100, 40, 40),
        (50, None, 10, 100, 50, 50),  # asking for the cap itself is fine
        (7, 32, 10, 100, 50, 7),
    ],
)
def test_resolve_max_tokens(
    requested: int | None,
    default: int | None,
    prompt_tokens: int,
    limit: int,
    cap: int | None,
    expected: int,
) -> None:
    prompt = Prompt("x", prompt_tokens)
    resolved = resolve_max_tokens(requested, default, prompt, limit, prompt_param="p", cap=cap)
    assert resolved == expected


@pytest.mark.parametrize(("requested", "default"), [(51, None), (90, 10)])
def test_asking_for_more_than_the_cap_is_a_400(requested: int, default: int | None) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        resolve_max_tokens(requested, default, Prompt("x", 10), 100, prompt_param="p", cap=50)
    assert caught.value.param == "max_tokens"
    assert caught.value.code is None
    assert str(caught.value) == (
        f"max_tokens is {requested}, more than the 50 your key allows per choice."
    )


@pytest.mark.parametrize(
    ("requested", "prompt_tokens", "param"),
    [
        (91, 10, "max_tokens"),
        (None, 100, "messages"),
        (None, 150, "messages"),
        (1, 100, "max_tokens"),
    ],
)
def test_context_length_exceeded(requested: int | None, prompt_tokens: int, param: str) -> None:
    with pytest.raises(ContextLengthExceeded) as caught:
        resolve_max_tokens(
            requested, None, Prompt("x", prompt_tokens), 100, prompt_param="messages"
        )
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("stop", "expected"),
    [(None, ()), ("x", ("x",)), (["a", "", "b"], ("a", "b")), ([], ())],
)
def test_stop_sequences(stop: str | list[str] | None, expected: tuple[str, ...]) -> None:
    assert stop_sequences(stop) == expected


def test_sampling_params_fill_defaults_and_keep_explicit_values() -> None:
    defaults = SamplingDefaults(temperature=0.7, top_p=0.9, top_k=40, repetition_penalty=1.1)
    params = sampling_params(
        chat(temperature=0.0, top_k=-1, seed=-1, stop="END", min_tokens=2, presence_penalty=0.5),
        defaults,
        max_tokens=7,
        logprobs=True,
    )
    assert params == SamplingParams(
        max_tokens=7,
        temperature=0.0,
        top_p=0.9,
        top_k=None,
        seed=2**64 - 1,
        presence_penalty=0.5,
        frequency_penalty=None,
        repetition_penalty=1.1,
        min_tokens=2,
        stop=("END",),
        logprobs=True,
        defaulted=frozenset({"top_p", "repetition_penalty"}),
    )


@pytest.mark.parametrize(
    ("seed", "n", "origins"),
    [
        (5, 1, ["client"]),
        (5, 2, ["client"] * 2),
        (None, 1, ["variation"]),
        (None, 3, ["choices"] * 3),
    ],
)
def test_fan_out_says_who_chose_each_seed(seed: int | None, n: int, origins: list[str]) -> None:
    params = SamplingParams(max_tokens=1, seed=seed)
    specs = fan_out([Prompt("p", 1)], n, [params], random.Random(0))
    assert [spec.params.seed_origin for spec in specs] == origins
    assert len({spec.params.seed for spec in specs}) == n


@pytest.mark.parametrize(
    ("fields", "defaults", "top_p", "top_k"),
    [
        ({}, SamplingDefaults(), 1.0, None),
        ({"top_k": 0}, SamplingDefaults(), 1.0, None),
        ({"top_k": 5}, SamplingDefaults(), None, 5),
        ({"top_p": 0.5}, SamplingDefaults(), 0.5, None),
        ({}, SamplingDefaults(top_k=40), None, 40),
        ({"top_p": None}, SamplingDefaults(top_p=0.9), 0.9, None),
    ],
)
def test_sampling_is_on_unless_narrowed(
    fields: dict[str, Any], defaults: SamplingDefaults, top_p: float | None, top_k: int | None
) -> None:
    params = sampling_params(chat(**fields), defaults, max_tokens=1, logprobs=False)
    assert (params.top_p, params.top_k) == (top_p, top_k)


def test_explicit_null_means_default() -> None:
    params = sampling_params(
        chat(temperature=None), SamplingDefaults(temperature=0.3), max_tokens=1, logprobs=False
    )
    assert params.temperature == 0.3


@pytest.mark.parametrize(
    ("seed", "n", "expected"),
    [(5, 1, [5]), (5, 3, [5, 6, 7]), (2**64 - 1, 2, [2**64 - 1, 0])],
)
def test_choice_seeds(seed: int | None, n: int, expected: list[int | None]) -> None:
    assert choice_seeds(seed, n, random.Random(0)) == expected


def test_choices_without_seed_get_distinct_random_seeds() -> None:
    seeds = choice_seeds(None, 4, random.Random(0))
    assert None not in seeds
    assert len(set(seeds)) == 4
    one, other = choice_seeds(None, 1, random.Random(1)), choice_seeds(None, 1, random.Random(2))
    assert None not in one
    assert one != other


def test_fan_out_numbers_choices_prompt_major() -> None:
    prompts = [Prompt("a", 1), Prompt("b", 2)]
    params = [SamplingParams(max_tokens=3, seed=10), SamplingParams(max_tokens=4, seed=10)]
    specs = fan_out(prompts, 2, params, random.Random(0))
    assert [(s.index, s.prompt_index, s.prompt.text, s.params.seed) for s in specs] == [
        (0, 0, "a", 10),
        (1, 0, "a", 11),
        (2, 1, "b", 10),
        (3, 1, "b", 11),
    ]
    assert [s.params.max_tokens for s in specs] == [3, 3, 4, 4]


CALL = {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_template_messages() -> None:
    request = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": "42", "tool_call_id": "1"},
        ]
    )
    assert template_messages(request.messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "42", "tool_call_id": "1"},
    ]


CALLS_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for call in m.tool_calls or [] %}{{ call.function.name }}"
    "{% for key, value in call.function.arguments.items() %} {{ key }}={{ value }}{% endfor %}"
    "{% endfor %}\n{% endfor %}assistant:"
)
"""A template that reads history calls' arguments as objects, as Hugging Face templates do."""


def text_model(tokenizer_dir: Path, template: Path | None = None) -> ServedModel:
    """The tiny text model (it takes no images), under ``template`` if given."""
    route = tiny_route(
        tokenizer_dir,
        chat_template_file=None if template is None else str(template),
        add_special_tokens=False,
        max_n=1,
    )
    return load_model(route, ThreadPoolExecutor(1))


async def test_a_history_of_calls_is_templated_without_tools_in_the_request(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Calls in the history reach the template with their arguments as objects, whether or not
    the request offers tools."""
    template = tmp_path / "calls.jinja"
    template.write_text(CALLS_TEMPLATE)
    call = {**CALL, "function": {"name": "f", "arguments": '{"city": "Paris"}'}}
    history = [
        USER,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "1"},
    ]
    model = text_model(tiny_model_dir, template)
    plan = await plan_chat(model, chat(messages=history), max_tokens_cap=None)
    assert "assistant: f city=Paris" in plan.choices[0].prompt.text


@pytest.mark.parametrize("role", ["user", "system"])
async def test_a_model_without_images_refuses_image_parts(tiny_model_dir: Path, role: str) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    content = [{"type": "text", "text": "Look:"}, image]
    request = chat(messages=[USER, {"role": role, "content": content}])
    with pytest.raises(InvalidRequestError, match="does not take images") as refused:
        await plan_chat(text_model(tiny_model_dir), request, max_tokens_cap=None)
    assert refused.value.param == "messages[1].content[1]"


def test_parts_other_than_text_and_images_are_rejected() -> None:
    request = chat(messages=[{"role": "user", "content": [{"type": "input_audio"}]}])
    with pytest.raises(InvalidRequestError) as caught:
        template_messages(request.messages)
    assert caught.value.param == "messages[0].content[0]"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 9}, "n"),
        ({"min_p": 0.1}, "min_p"),
        ({"top_logprobs": 2, "logprobs": True}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_check_chat_rejects(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_chat(chat(**fields), max_n=8)
    assert caught.value.param == param


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"n": 8},
        {"min_p": 0.0},
        {"top_logprobs": 0, "logprobs": True},
        {"stream": True, "stream_options": {"include_usage": True}},
    ],
)
def test_check_chat_accepts(fields: dict[str, Any]) -> None:
    check_chat(chat(**fields), max_n=8)


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"logprobs": 1}, "logprobs"), ({"suffix": "x"}, "suffix")],
)
def test_check_completion_rejects(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_completion(completion(**fields), max_n=8)
    assert caught.value.param == param


@pytest.mark.parametrize("fields", [{"logprobs": 0}, {"best_of": 2, "n": 2}, {"suffix": ""}])
def test_check_completion_accepts(fields: dict[str, Any]) -> None:
    check_completion(completion(**fields), max_n=8)


@pytest.mark.parametrize("body", [chat, completion])
@pytest.mark.parametrize(
    ("fields", "width", "param"),
    [
        ({"n": 1, "best_of": 4}, 4, "best_of"),
        ({"n": 2, "best_of": 2}, 2, "n"),
        ({"n": 3}, 3, "n"),
        ({"best_of": 2, "top_p": 1.0, "top_k": -1, "seed": 7}, 2, "best_of"),
        ({"n": 2, "top_k": 0, "temperature": 1.0}, 2, "n"),
    ],
)
def test_beam_width_is_the_larger_of_n_and_best_of_on_chat_and_completions(
    body: Any, fields: dict[str, Any], width: int, param: str
) -> None:
    beam = beam_search(body(use_beam_search=True, **fields))
    assert beam is not None and (beam.width, beam.param) == (width, param)


@pytest.mark.parametrize("body", [chat, completion])
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"best_of": 3}, "best_of"),  # a beam width without a beam search
        ({"use_beam_search": True, "n": 3, "best_of": 2}, "best_of"),
        ({"best_of": 1, "n": 2}, "best_of"),
        ({"use_beam_search": True, "top_p": 0.9}, "top_p"),
        ({"use_beam_search": True, "top_k": 5}, "top_k"),
        ({"use_beam_search": True, "stream": True}, "stream"),
        ({"length_penalty": 1.0}, "length_penalty"),
    ],
)
def test_beam_search_refuses_naming_the_field(
    body: Any, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        beam_search(body(**fields))
    assert caught.value.param == param


@pytest.mark.parametrize("body", [chat, completion])
def test_best_of_equal_to_n_samples(body: Any) -> None:
    assert beam_search(body(n=2, best_of=2)) is None


_DEMO_DEFAULTS = SamplingDefaults(
    temperature=0.2, top_p=0.9, top_k=40, repetition_penalty=1.1, presence_penalty=0.5,
    frequency_penalty=0.5, min_tokens=2,
)  # fmt: skip


@pytest.mark.parametrize("body", [chat, completion])
def test_beam_choices_take_none_of_the_models_sampling_defaults(body: Any) -> None:
    """A model's sampling defaults would reshape every beam's log probs (the engine scores the
    processed logits): a beam search ranks by the model's likelihood unless the client asks
    otherwise, so only ``min_tokens``, which is no sampling control, keeps its default."""
    request = body(use_beam_search=True, n=3)
    params = sampling_params(request, _DEMO_DEFAULTS, max_tokens=8, logprobs=False)
    beam = beam_search(request)
    assert beam is not None
    choices = beam_choices([Prompt(text="p", token_count=2)], 3, [params], beam)
    for choice in choices:
        sent = choice.params
        assert (sent.temperature, sent.top_p, sent.top_k, sent.seed) == (None,) * 4
        assert (sent.repetition_penalty, sent.presence_penalty, sent.frequency_penalty) == (
            None,
        ) * 3
        assert sent.min_tokens == 2 and sent.beam == beam


@pytest.mark.parametrize("body", [chat, completion])
def test_beam_choices_keep_the_clients_own_sampling_controls(body: Any) -> None:
    request = body(use_beam_search=True, n=2, temperature=0.5, repetition_penalty=1.2)
    params = sampling_params(request, _DEMO_DEFAULTS, max_tokens=8, logprobs=False)
    beam = beam_search(request)
    assert beam is not None
    (first, _) = beam_choices([Prompt(text="p", token_count=2)], 2, [params], beam)
    assert (first.params.temperature, first.params.repetition_penalty) == (0.5, 1.2)
    assert first.params.presence_penalty is None
