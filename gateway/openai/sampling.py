"""Pure translation of the sampling fields both completion endpoints share into neutral
sampling parameters: checks, the completion budget, defaults, the guide of ``response_format``,
and one seed per choice.

vLLM's beam-search fields (``use_beam_search`` with ``n`` and ``best_of``, ``length_penalty``,
``early_stopping``) become one TensorRT-LLM beam search per prompt, whose best ``n`` beams are
the choices; what a beam search cannot honour is refused naming the field.

Every field is read with ``given``, which tells a field the client sent from one it left out
or sent as ``null``.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import TypeVar

from msgspec import UNSET, UnsetType

from adapters.contract import BeamSearch, Guide, SamplingParams, SeedOrigin
from gateway.core.plan import ChoiceSpec, Prompt
from gateway.errors import ContextLengthExceeded, InvalidRequestError
from gateway.openai.protocol import ResponseFormat, SamplingFields
from gateway.settings import SamplingDefaults

T = TypeVar("T")
SEED_MASK = 2**64 - 1


def given(value: T | UnsetType | None) -> T | None:
    """The value the client sent, or ``None`` for both absent and null."""
    return None if isinstance(value, UnsetType) else value


def first_given(*values: T | UnsetType | None) -> T | None:
    """The first value the client sent, if any."""
    for value in values:
        if (found := given(value)) is not None:
            return found
    return None


def check_common(request: SamplingFields, max_n: int) -> None:
    n = given(request.n) or 1
    if n > max_n:
        raise InvalidRequestError(f"n must be at most {max_n} for this model, got {n}.", param="n")
    seed = given(request.seed)
    if seed is not None and not -(2**63) <= seed <= SEED_MASK:
        raise InvalidRequestError(
            f"seed must be a 64-bit integer (from {-(2**63)} to {SEED_MASK}), got {seed}.",
            param="seed",
        )
    if given(request.logit_bias):
        raise InvalidRequestError(
            "logit_bias is not supported: the TensorRT-LLM models' bias inputs take words, not "
            "token ids.",
            param="logit_bias",
        )
    if given(request.min_p):
        raise InvalidRequestError(
            "min_p is not supported by TensorRT-LLM models served through Triton.", param="min_p"
        )
    _refuse_phases(request)
    if given(request.stream_options) is not None and not given(request.stream):
        raise InvalidRequestError(
            "stream_options is only allowed when stream is true.", param="stream_options"
        )


def _refuse_phases(request: SamplingFields) -> None:
    """A client choosing a disaggregation phase, or handing over another engine's KV cache
    (whose handoff id lets its holder take blocks of someone else's prompt), is refused: the
    gateway alone splits requests between its context and generation pools."""
    for name in ("request_type", "context_phase_params", "disaggregated_params"):
        if getattr(request, name) is not UNSET:
            raise InvalidRequestError(
                f"{name} is not accepted: the gateway decides where each phase of a request "
                "runs and hands the KV cache over itself.",
                param=name,
            )


def stop_sequences(stop: str | list[str] | None) -> tuple[str, ...]:
    """Stop sequences as a tuple; empty strings are dropped."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    return tuple(s for s in stops if s)


def response_guide(response_format: ResponseFormat | None) -> Guide | None:
    """The guide of ``response_format`` (``text``: none)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return Guide("json")
    if response_format.type == "json_schema":
        spec = given(response_format.json_schema)
        schema = given(spec.schema) if spec is not None else None
        if not isinstance(schema, dict):
            raise InvalidRequestError(
                "response_format json_schema needs json_schema.schema, a JSON schema object.",
                param="response_format.json_schema.schema",
            )
        return Guide("json_schema", json.dumps(schema))
    raise InvalidRequestError(
        f"response_format type {response_format.type!r} is not supported: use text, "
        "json_object or json_schema.",
        param="response_format.type",
    )


def resolve_max_tokens(
    requested: int | None,
    default: int | None,
    prompt: Prompt,
    limit: int,
    *,
    prompt_param: str,
    cap: int | None = None,
) -> int:
    """Completion length: asked for, else the configured default, else the rest of the window.

    ``cap`` is the most the caller may have per choice (its tenant's ``max_tokens``): a request
    that names no length gets at most that, one that asks for more is refused.
    """
    room = limit - prompt.token_count
    if requested is not None and requested > room:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt.token_count + requested} tokens ({prompt.token_count} in the prompt, "
            f"{requested} in the completion). Please reduce the prompt or the completion length.",
            param="max_tokens",
        )
    if room < 1:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {limit} tokens. However, your prompt is "
            f"{prompt.token_count} tokens long. Please reduce the length of the prompt.",
            param=prompt_param,
        )
    if requested is not None and cap is not None and requested > cap:
        raise InvalidRequestError(
            f"max_tokens is {requested}, more than the {cap} your key allows per choice.",
            param="max_tokens",
        )
    if requested is not None:
        return requested
    return min(value for value in (default, room, cap) if value is not None)


def sampling_params(
    request: SamplingFields,
    defaults: SamplingDefaults,
    *,
    max_tokens: int,
    logprobs: bool,
    guide: Guide | None = None,
) -> SamplingParams:
    """The neutral sampling parameters of a request, defaults filled in.

    Fields the client left out and a default filled in are named in ``defaulted``: a model
    without that input is served without it instead of failing the request.
    """
    top_k = first_given(request.top_k, defaults.top_k)
    top_k = top_k if top_k is not None and top_k > 0 else None
    top_p = first_given(request.top_p, defaults.top_p)
    if top_p is None and top_k is None:
        # OpenAI samples unless told otherwise; TensorRT-LLM decodes greedily without either.
        top_p = 1.0
    seed = given(request.seed)
    defaulted = frozenset(
        name
        for name in _DEFAULTABLE
        if given(getattr(request, name)) is None
        and (getattr(defaults, name) is not None or name == "top_p")
    )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=first_given(request.temperature, defaults.temperature),
        top_p=top_p,
        top_k=top_k,
        seed=seed & SEED_MASK if seed is not None else None,
        presence_penalty=first_given(request.presence_penalty, defaults.presence_penalty),
        frequency_penalty=first_given(request.frequency_penalty, defaults.frequency_penalty),
        repetition_penalty=first_given(request.repetition_penalty, defaults.repetition_penalty),
        min_tokens=first_given(request.min_tokens, defaults.min_tokens),
        stop=stop_sequences(None if isinstance(request.stop, UnsetType) else request.stop),
        logprobs=logprobs,
        defaulted=defaulted,
        guide=guide,
    )


_DEFAULTABLE = (
    "temperature",
    "top_p",
    "top_k",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
)


def choice_seeds(seed: int | None, n: int, rng: random.Random) -> list[int]:
    """Distinct seeds for ``n`` choices: ``seed + i``, from a random base when none is given.

    TensorRT-LLM's default seed is fixed, so an unseeded request would sample the same text
    every time; OpenAI's unseeded requests vary.
    """
    base = seed if seed is not None else rng.getrandbits(63)
    return [(base + i) & SEED_MASK for i in range(n)]


def fan_out(
    prompts: list[Prompt], n: int, params_of: list[SamplingParams], rng: random.Random
) -> tuple[ChoiceSpec, ...]:
    """``n`` choices per prompt, numbered prompt-major as OpenAI does, each with its own seed."""
    specs = []
    for prompt_index, (prompt, params) in enumerate(zip(prompts, params_of, strict=True)):
        origin: SeedOrigin = "client"
        if params.seed is None:
            origin = "choices" if n > 1 else "variation"
        for offset, seed in enumerate(choice_seeds(params.seed, n, rng)):
            specs.append(
                ChoiceSpec(
                    index=prompt_index * n + offset,
                    prompt_index=prompt_index,
                    prompt=prompt,
                    params=replace(params, seed=seed, seed_origin=origin),
                )
            )
    return tuple(specs)


def include_usage(request: SamplingFields) -> bool:
    """Whether a streamed answer ends with a usage chunk."""
    options = given(request.stream_options)
    return bool(given(request.stream)) and options is not None and bool(options.include_usage)


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
