"""vLLM's beam-search fields (``use_beam_search`` with ``n`` and ``best_of``, ``length_penalty``,
``early_stopping``) as one TensorRT-LLM beam search per prompt, whose best ``n`` beams are the
choices; what a beam search cannot honour is refused naming the field."""

from __future__ import annotations

from dataclasses import replace

from adapters.contract import BeamSearch, SamplingParams
from gateway.core.plan import ChoiceSpec, Prompt
from gateway.errors import InvalidRequestError
from gateway.openai.protocol import SamplingFields, given

_EARLY_STOPPING = {True: 1, False: 0, "never": 2}
# Sampling controls a beam search has no use for, with the values that leave every token a
# candidate: these change nothing (TensorRT-LLM's beam search takes every token's log prob, and
# a seed has nothing to draw), other values would ask for a narrowing the search does not do.
_NEUTRAL: dict[str, tuple[float, ...]] = {"top_p": (1.0,), "top_k": (0, -1)}
# A model's sampling defaults (a demo's low temperature and repetition penalty that keep sampled
# answers on topic) would reshape every beam's log probs: the engine scores candidates by the
# log-softmax of the processed logits, as TensorRT-LLM does, so a search under them ranks beams
# by something other than the model's likelihood. A beam search takes only what the client sent.
_SAMPLING_DEFAULTS = frozenset(
    {"temperature", "presence_penalty", "frequency_penalty", "repetition_penalty"}
)


def beam_search(request: SamplingFields) -> BeamSearch | None:
    """The request's beam search, or None when it samples. ``best_of`` without
    ``use_beam_search`` is refused unless it equals ``n`` (it is a beam width here)."""
    n = given(request.n) or 1
    best_of = given(request.best_of)
    if best_of is not None and best_of < n:
        raise InvalidRequestError(f"best_of must be at least n ({n}).", param="best_of")
    if not given(request.use_beam_search):
        if best_of is not None and best_of != n:
            raise InvalidRequestError(
                "best_of is the beam width of a beam search: set use_beam_search to true.",
                param="best_of",
            )
        for name in ("length_penalty", "early_stopping"):
            if given(getattr(request, name)) is not None:
                raise InvalidRequestError(
                    f"{name} applies to beam search only: set use_beam_search to true.",
                    param=name,
                )
        return None
    for name, neutral in _NEUTRAL.items():
        value = given(getattr(request, name))
        if value is not None and value not in neutral:
            raise InvalidRequestError(
                f"{name} {value} cannot be combined with use_beam_search: a beam search does "
                f"not sample (only {' or '.join(map(str, neutral))} is accepted).",
                param=name,
            )
    refused = {
        "stream": "beams change until the search ends, so they are answered whole",
        "response_format": "the engine does not guide a beam search",
        "tools": "the engine does not guide a beam search",
    }
    for name, reason in refused.items():
        value = given(getattr(request, name, None))
        if value is not None and value is not False and value != []:
            raise InvalidRequestError(
                f"{name} cannot be combined with use_beam_search: {reason}.", param=name
            )
    width = max(n, best_of or n)
    early = given(request.early_stopping)
    return BeamSearch(
        width=width,
        length_penalty=given(request.length_penalty),
        early_stopping=None if early is None else _EARLY_STOPPING[early],
        param="best_of" if width > n else "n",
    )


def beam_choices(
    prompts: list[Prompt], n: int, params_of: list[SamplingParams], beam: BeamSearch
) -> tuple[ChoiceSpec, ...]:
    """``n`` choices per prompt, numbered prompt-major, that one beam search per prompt answers
    with its best ``n`` beams, under only the sampling controls the client sent."""
    return tuple(
        ChoiceSpec(
            index=prompt_index * n + offset,
            prompt_index=prompt_index,
            prompt=prompt,
            params=_beam_params(params, beam),
        )
        for prompt_index, (prompt, params) in enumerate(zip(prompts, params_of, strict=True))
        for offset in range(n)
    )


def _beam_params(params: SamplingParams, beam: BeamSearch) -> SamplingParams:
    """``params`` for a beam search: no seed, top-p or top-k (they were refused unless neutral)
    and none of the model's sampling defaults."""
    dropped = _SAMPLING_DEFAULTS & params.defaulted

    def sent(name: str, value: float | None) -> float | None:
        return None if name in dropped else value

    return replace(
        params,
        beam=beam,
        seed=None,
        top_p=None,
        top_k=None,
        temperature=sent("temperature", params.temperature),
        presence_penalty=sent("presence_penalty", params.presence_penalty),
        frequency_penalty=sent("frequency_penalty", params.frequency_penalty),
        repetition_penalty=sent("repetition_penalty", params.repetition_penalty),
        defaulted=params.defaulted - dropped - {"top_p", "top_k"},
    )
