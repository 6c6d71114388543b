"""The generation core over a scripted backend: stops, finish reasons, counts, merging, closing."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from adapters.contract import (
    BackendError,
    BackendUnavailable,
    Beam,
    BeamSearch,
    GenerationRequest,
    PromptImage,
    SamplingParams,
    TokenChunk,
)
from adapters.scripted import ScriptedBackend
from gateway.catalog.registry import ServedModel
from gateway.core.events import (
    ChoiceEnd,
    TextDelta,
    UsageMeter,
    finish_reason,
    token_texts,
)
from gateway.core.generation import GenerationService
from gateway.core.plan import ChoiceSpec, Plan, Prompt
from gateway.errors import GatewayTimeoutError
from tests.support.generation import chunks, plan


@pytest.mark.parametrize(
    ("stopped", "tokens", "max_tokens", "reason"),
    [
        (False, 10, 10, "length"),
        (False, 9, 10, "stop"),
        (True, 10, 10, "stop"),
        (False, 11, 10, "length"),
    ],
)
def test_finish_reason(stopped: bool, tokens: int, max_tokens: int, reason: str) -> None:
    assert finish_reason(stopped, tokens, max_tokens) == reason


@pytest.mark.parametrize(
    ("text", "count", "pieces", "expected"),
    [
        ("ab", 1, None, ("ab",)),
        ("ab", 2, ["a", "b"], ("a", "b")),
        ("ab", 2, ["ab"], ("ab", "")),
        ("", 0, None, ()),
    ],
)
def test_token_texts(
    text: str, count: int, pieces: list[str] | None, expected: tuple[str, ...]
) -> None:
    assert token_texts(text, count, pieces) == expected


async def test_stop_across_chunks_cancels_the_backend_request(served: ServedModel) -> None:
    backend = ScriptedBackend(chunks("Hello", " EN", "D of", " it", " never"))
    results = await GenerationService(backend, timeout_s=5).collect(served, plan(stop=("END",)))
    assert results[0].text == "Hello "
    assert results[0].end == ChoiceEnd(0, 0, "stop", 3, 3)
    assert backend.closed_early == [backend.requests[0].request_id]


async def test_length_when_the_budget_is_used(served: ServedModel) -> None:
    backend = ScriptedBackend(chunks("a", "b", "c"))
    results = await GenerationService(backend, timeout_s=5).collect(served, plan(max_tokens=3))
    assert results[0].end is not None
    assert results[0].end.finish_reason == "length"
    assert backend.closed_early == []


async def test_missing_counts_fall_back_to_the_tokenizer(served: ServedModel) -> None:
    backend = ScriptedBackend(chunks("the model", " token", count=None))
    results = await GenerationService(backend, timeout_s=5).collect(served, plan())
    expected = await served.tokenizer.count("the model token")
    assert results[0].end is not None
    assert results[0].end.completion_tokens == expected > 0


async def test_recounted_tokens_never_exceed_max_tokens(served: ServedModel) -> None:
    backend = ScriptedBackend(chunks("the model token server request", count=None))
    results = await GenerationService(backend, timeout_s=5).collect(served, plan(max_tokens=2))
    assert results[0].end is not None
    assert (results[0].end.completion_tokens, results[0].end.finish_reason) == (2, "length")


async def test_the_gateway_sends_its_own_count_of_a_text_prompt_where_it_is_the_engines(
    served: ServedModel,
) -> None:
    """With it the backend leaves ``num_input_tokens`` unasked; without (a deployment that may
    tokenize otherwise, a prompt with images) the engine counts."""
    counting = dataclasses.replace(
        served, route=dataclasses.replace(served.route, counts_prompts=True)
    )

    async def one_image() -> tuple[PromptImage, ...]:
        return (PromptImage(b"\x89PNG", "image/png"),)

    pictured = await dataclasses.replace(plan(), images=one_image).with_images()
    sent = []
    for model, request in ((counting, plan()), (served, plan()), (counting, pictured)):
        # The engine reports no prompt count: usage takes the gateway's.
        backend = ScriptedBackend([TokenChunk("a", 1), TokenChunk("b", 1)])
        results = await GenerationService(backend, timeout_s=5).collect(model, request)
        sent.append(backend.requests[0].prompt_tokens)
        assert results[0].end is not None
        assert results[0].end.prompt_tokens == request.choices[0].prompt.token_count
    assert sent == [3, None, None]


async def test_n_choices_are_merged_with_distinct_request_ids(served: ServedModel) -> None:
    backend = ScriptedBackend(chunks("x", "y"))
    events = [e async for e in GenerationService(backend, timeout_s=5).events(served, plan(3))]
    assert sorted(e.index for e in events if isinstance(e, ChoiceEnd)) == [0, 1, 2]
    for index in range(3):
        texts = [e.text for e in events if isinstance(e, TextDelta) and e.index == index]
        assert texts == ["x", "y"]
    assert len({r.request_id for r in backend.requests}) == 3


async def test_a_failing_choice_fails_the_request_and_closes_the_others(
    served: ServedModel,
) -> None:
    def script(request: GenerationRequest) -> list[TokenChunk | BackendError]:
        if request.request_id.endswith("-1"):
            return [BackendUnavailable("down")]
        return [*chunks(*["t"] * 50)]

    backend = ScriptedBackend(script, delay_s=0.01)
    with pytest.raises(BackendUnavailable):
        await GenerationService(backend, timeout_s=5).collect(served, plan(2))
    assert [r.request_id for r in backend.requests if r.request_id.endswith("-0")] == [
        id_ for id_ in backend.closed_early if id_.endswith("-0")
    ]


async def test_closing_the_stream_early_cancels_every_backend_request(
    served: ServedModel,
) -> None:
    backend = ScriptedBackend(chunks(*["t"] * 100), delay_s=0.01)
    events = GenerationService(backend, timeout_s=5).events(served, plan(2))
    first = await anext(events)
    assert isinstance(first, TextDelta)
    await events.aclose()
    assert sorted(backend.closed_early) == sorted(r.request_id for r in backend.requests)


async def test_a_generation_past_the_timeout_fails_and_is_cancelled(served: ServedModel) -> None:
    backend = ScriptedBackend(chunks(*["t"] * 100), delay_s=0.05)
    with pytest.raises(GatewayTimeoutError):
        await GenerationService(backend, timeout_s=0.2).collect(served, plan())
    assert backend.closed_early == [backend.requests[0].request_id]


async def test_the_deadline_passing_while_the_consumer_is_busy_ends_the_stream(
    served: ServedModel,
) -> None:
    backend = ScriptedBackend(chunks(*["t"] * 100))
    events = GenerationService(backend, timeout_s=0.1).events(served, plan())
    assert isinstance(await anext(events), TextDelta)
    await asyncio.sleep(0.2)  # the consumer is away when the deadline passes
    with pytest.raises(GatewayTimeoutError):
        await anext(events)
    await events.aclose()
    assert backend.closed_early == [backend.requests[0].request_id]


async def test_a_cancellation_from_elsewhere_is_not_taken_for_the_deadline(
    served: ServedModel,
) -> None:
    backend = ScriptedBackend(chunks(*["t"] * 100), delay_s=0.05)

    async def consume() -> None:
        await GenerationService(backend, timeout_s=5).collect(served, plan())

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0.12)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert backend.closed_early == [backend.requests[0].request_id]


async def test_a_beam_search_closed_after_its_answer_is_charged_every_beam(
    served: ServedModel,
) -> None:
    beam = BeamSearch(width=3, param="best_of")
    params = SamplingParams(max_tokens=10, beam=beam)
    prompt = Prompt("hello", 3)
    beam_plan = Plan(
        model="tiny",
        choices=tuple(ChoiceSpec(i, 0, prompt, params) for i in range(2)),
        stream=False,
        include_usage=True,
    )
    answer = TokenChunk(
        text="aa",
        token_count=None,
        prompt_tokens=3,
        beams=(Beam("aa", 4), Beam("bb", 5), Beam("cc", 6)),
    )
    meter = UsageMeter()
    events = GenerationService(ScriptedBackend([answer]), timeout_s=5).events(
        served, beam_plan, meter
    )
    first = await anext(events)
    assert isinstance(first, TextDelta) and first.text == "aa"
    await events.aclose()
    assert meter.total() == 3 + 4 + 5 + 6


def _cut_pieces(pieces: list[str], length: int) -> list[str]:
    """The pieces spelling the first ``length`` characters, the last one cut to fit."""
    kept, used = [], 0
    for piece in pieces:
        if used >= length:
            break
        kept.append(piece[: length - used])
        used += len(kept[-1])
    return kept


def _answer(
    text: str, pieces: list[str], logprobs: list[float], *, stream: bool
) -> list[TokenChunk]:
    """``text`` as the backend answers it with its log probs: streamed, a token a chunk; whole,
    one chunk."""
    if stream:
        return [
            TokenChunk(piece, 1, 3, logprobs=(logprob,))
            for piece, logprob in zip(pieces, logprobs, strict=True)
        ]
    return [TokenChunk(text, len(pieces), 3, logprobs=tuple(logprobs))]


@pytest.mark.parametrize("stream", [True, False])
async def test_log_probs_after_a_stop_cut_are_those_of_the_text_returned(
    served: ServedModel, stream: bool
) -> None:
    """Streamed (a token a chunk) or whole (one chunk, its tokens re-tokenized), the tokens and
    log probs of an answer a stop sequence cut spell the text returned, token for token."""
    text = "the model answers.\nmore text after the stop"
    pieces = await served.tokenizer.pieces(text)
    logprobs = [-0.5 - index for index in range(len(pieces))]
    answer = _answer(text, pieces, logprobs, stream=stream)
    asked = dataclasses.replace(plan(max_tokens=50, stop=("s.\n",)), logprobs=True)
    results = await GenerationService(ScriptedBackend(answer), timeout_s=5).collect(served, asked)
    (result,) = results
    assert result.text == "the model answer"
    assert result.tokens == _cut_pieces(pieces, len(result.text))
    assert result.logprobs == logprobs[: len(result.tokens)]


@pytest.mark.parametrize("stream", [True, False])
async def test_log_probs_without_stop_sequences_spell_the_whole_answer(
    served: ServedModel, stream: bool
) -> None:
    """No stop sequence to cut: every token and its log prob still come with the text."""
    text = "the model answers.\nmore text"
    pieces = await served.tokenizer.pieces(text)
    logprobs = [-0.5 - index for index in range(len(pieces))]
    answer = _answer(text, pieces, logprobs, stream=stream)
    asked = dataclasses.replace(plan(max_tokens=50), logprobs=True)
    results = await GenerationService(ScriptedBackend(answer), timeout_s=5).collect(served, asked)
    (result,) = results
    assert (result.text, result.tokens, result.logprobs) == (text, pieces, logprobs)


async def test_a_beams_log_probs_after_a_stop_cut_are_those_of_its_text(
    served: ServedModel,
) -> None:
    text = "the beam.\nafter"
    pieces = await served.tokenizer.pieces(text)
    logprobs = tuple(-1.0 - index for index in range(len(pieces)))
    params = SamplingParams(max_tokens=10, stop=("\n",), beam=BeamSearch(width=2))
    beam_plan = Plan(
        model="tiny",
        choices=(ChoiceSpec(0, 0, Prompt("hello", 3), params),),
        stream=False,
        include_usage=True,
        logprobs=True,
    )
    answer = TokenChunk(text, None, 3, beams=(Beam(text, len(pieces), logprobs), Beam("b", 1)))
    backend = ScriptedBackend([answer])
    (result,) = await GenerationService(backend, timeout_s=5).collect(served, beam_plan)
    assert result.text == "the beam."
    assert result.tokens == _cut_pieces(pieces, len(result.text))
    assert result.logprobs == list(logprobs[: len(result.tokens)])
