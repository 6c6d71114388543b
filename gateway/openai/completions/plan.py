"""Plan a text completion: validate, tokenize each prompt, fan out ``n`` choices per prompt."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from gateway.catalog.registry import ServedModel
from gateway.catalog.vision import VisionInputs
from gateway.core.plan import Plan, Prompt
from gateway.errors import InvalidRequestError
from gateway.ids import rng
from gateway.openai.protocol import CompletionRequest
from gateway.openai.sampling import (
    beam_choices,
    beam_search,
    check_common,
    fan_out,
    given,
    include_usage,
    resolve_max_tokens,
    response_guide,
    sampling_params,
)


def check_completion(request: CompletionRequest, max_n: int) -> None:
    """Reject what the deployment cannot serve, with the offending field named."""
    check_common(request, max_n)
    if given(request.logprobs):
        raise InvalidRequestError(
            "logprobs > 0 is not supported: TensorRT-LLM through Triton returns only the "
            "log probabilities of the sampled tokens; use logprobs=0.",
            param="logprobs",
        )
    if given(request.suffix):
        raise InvalidRequestError("suffix is not supported.", param="suffix")


def _prompts(model: ServedModel, prompt: str | list[Any]) -> Awaitable[list[Prompt]]:
    """Text, texts, token ids or lists of token ids, as OpenAI's ``prompt`` takes them; a list
    is tokenized as one batch."""
    tokenizer = model.tokenizer
    if isinstance(prompt, str):
        return _one(tokenizer.text_prompt(prompt))
    if all(isinstance(item, str) for item in prompt):
        return tokenizer.text_prompts(prompt)
    if all(_is_token(item) for item in prompt):
        return _one(tokenizer.token_prompt(prompt, "prompt"))
    if all(isinstance(item, list) and item and all(map(_is_token, item)) for item in prompt):
        return tokenizer.token_prompts([(ids, f"prompt[{i}]") for i, ids in enumerate(prompt)])
    raise InvalidRequestError(
        "prompt must be a string, a list of strings, a list of token ids or a list of "
        "non-empty lists of token ids.",
        param="prompt",
    )


def _refuse_image_tokens(prompts: list[Prompt], vision: VisionInputs, single: bool) -> None:
    """A 400 for a prompt holding the model's image token: completions take no images."""
    for index, prompt in enumerate(prompts):
        if vision.image_token_id in prompt.ids:
            raise InvalidRequestError(
                f"The prompt holds the model's image token {vision.image_token!r}; images are "
                "taken by /v1/chat/completions as image_url parts.",
                param="prompt" if single or len(prompts) == 1 else f"prompt[{index}]",
            )


async def _one(prompt: Awaitable[Prompt]) -> list[Prompt]:
    return [await prompt]


def _is_token(item: object) -> bool:
    return isinstance(item, int) and not isinstance(item, bool)


async def plan_completion(
    model: ServedModel, request: CompletionRequest, *, max_tokens_cap: int | None
) -> Plan:
    """The backend requests answering a text completion, ``n`` per prompt, each choice within
    ``max_tokens_cap`` as in ``plan_chat``."""
    check_completion(request, model.route.max_n)
    prompts = await _prompts(model, request.prompt)
    if model.vision is not None:
        _refuse_image_tokens(prompts, model.vision, isinstance(request.prompt, str))
    requested = given(request.max_tokens)
    logprobs = given(request.logprobs) is not None
    guide = response_guide(given(request.response_format))
    params = [
        sampling_params(
            request,
            model.route.defaults,
            max_tokens=resolve_max_tokens(
                requested,
                model.route.defaults.max_tokens,
                prompt,
                model.context_length,
                prompt_param="prompt",
                cap=max_tokens_cap,
            ),
            logprobs=logprobs,
            guide=guide,
        )
        for prompt in prompts
    ]
    n = given(request.n) or 1
    beam = beam_search(request)
    choices = (
        fan_out(prompts, n, params, rng) if beam is None else beam_choices(prompts, n, params, beam)
    )
    return Plan(
        model=model.name,
        choices=choices,
        stream=bool(given(request.stream)),
        include_usage=include_usage(request),
        logprobs=logprobs,
        echo=bool(given(request.echo)),
    )
