"""Pure translation of the sampling fields both completion endpoints share into neutral
sampling parameters: checks, the completion budget, defaults, and one seed per choice."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import TypeVar

from msgspec import UNSET, UnsetType

from adapters.contract import Guide, SamplingParams, SeedOrigin
from gateway.core.plan import ChoiceSpec, Prompt
from gateway.errors import ContextLengthExceeded, InvalidRequestError
from gateway.openai.protocol import SamplingFields, first_given, given
from gateway.settings import SamplingDefaults

T = TypeVar("T")
SEED_MASK = 2**64 - 1


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
