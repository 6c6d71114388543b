"""Pure translation of OpenAI request bodies into neutral generation requests."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import msgspec
from msgspec import UnsetType

from adapters.contract import Guide, SamplingParams, SeedOrigin
from gateway.errors import ContextLengthExceeded, InvalidRequestError
from gateway.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
)
from gateway.settings import SamplingDefaults
from gateway.tools.plan import TEXT_ONLY, OutputPlan

T = TypeVar("T")
SEED_MASK = 2**64 - 1


@dataclass(frozen=True, slots=True)
class Prompt:
    """A templated prompt and its length in the model's tokens.

    ``shown`` is what ``echo`` repeats when it differs from the text sent (an empty prompt is
    sent as the tokenizer's start-of-text token).
    """

    text: str
    token_count: int
    shown: str | None = None
    ids: tuple[int, ...] = ()
    """The prompt's token ids as the engine takes them (special tokens included)."""

    @property
    def echoed(self) -> str:
        """The prompt as the client wrote it."""
        return self.text if self.shown is None else self.shown


@dataclass(frozen=True, slots=True)
class ChoiceSpec:
    """One backend request: the ``index``-th choice of the answer."""

    index: int
    prompt_index: int
    prompt: Prompt
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything needed to run one API request and shape its answer."""

    model: str
    choices: tuple[ChoiceSpec, ...]
    stream: bool
    include_usage: bool
    logprobs: bool = False
    echo: bool = False
    output: OutputPlan = TEXT_ONLY
    """How the answer's text becomes content and tool calls (chat)."""


def given(value: T | UnsetType | None) -> T | None:
    """The value the client sent, or ``None`` for both absent and null."""
    return None if isinstance(value, UnsetType) else value


def first_given(*values: T | UnsetType | None) -> T | None:
    """The first value the client sent, if any."""
    for value in values:
        if (found := given(value)) is not None:
            return found
    return None


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: text content, ``developer`` as ``system``."""
    converted = []
    for index, message in enumerate(messages):
        entry: dict[str, Any] = {
            "role": "system" if message.role == "developer" else message.role,
            "content": _text_content(message, index),
        }
        for key in ("name", "tool_calls", "tool_call_id"):
            value = given(getattr(message, key))
            if value is not None:
                entry[key] = msgspec.to_builtins(value)
        converted.append(entry)
    return converted


def _text_content(message: ChatMessage, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part_index, part in enumerate(content):
        text = given(part.text)
        if part.type != "text" or text is None:
            raise InvalidRequestError(
                f"Only text content parts are supported, got a part of type {part.type!r}.",
                param=f"messages[{index}].content[{part_index}]",
            )
        texts.append(text)
    return "".join(texts)


def check_chat(request: ChatCompletionRequest, max_n: int) -> None:
    """Reject what the deployment cannot serve, with the offending field named."""
    _check_common(request, max_n)
    top = given(request.top_logprobs)
    if top:
        raise InvalidRequestError(
            "top_logprobs > 0 is not supported: TensorRT-LLM through Triton returns only the "
            "log probabilities of the sampled tokens.",
            param="top_logprobs",
        )


def check_completion(request: CompletionRequest, max_n: int) -> None:
    """Reject what the deployment cannot serve, with the offending field named."""
    _check_common(request, max_n)
    if given(request.logprobs):
        raise InvalidRequestError(
            "logprobs > 0 is not supported: TensorRT-LLM through Triton returns only the "
            "log probabilities of the sampled tokens; use logprobs=0.",
            param="logprobs",
        )
    if given(request.suffix):
        raise InvalidRequestError("suffix is not supported.", param="suffix")
    best_of = given(request.best_of)
    if best_of is not None and best_of != (given(request.n) or 1):
        raise InvalidRequestError("best_of is not supported.", param="best_of")


def _check_common(request: SamplingFields, max_n: int) -> None:
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
    if given(request.stream_options) is not None and not given(request.stream):
        raise InvalidRequestError(
            "stream_options is only allowed when stream is true.", param="stream_options"
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
