"""Plan a chat or text completion: validate, template, count tokens, fan out choices."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable
from typing import Any

from gateway.errors import InvalidRequestError
from gateway.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from gateway.registry import ServedModel
from gateway.tools import conversation, plan_output, response_guide
from gateway.translate import (
    Plan,
    Prompt,
    check_chat,
    check_completion,
    fan_out,
    first_given,
    given,
    resolve_max_tokens,
    sampling_params,
    template_messages,
)

_rng = random.SystemRandom()


def _include_usage(request: SamplingFields) -> bool:
    options = given(request.stream_options)
    return bool(given(request.stream)) and options is not None and bool(options.include_usage)


async def plan_chat(
    model: ServedModel, request: ChatCompletionRequest, *, max_tokens_cap: int | None
) -> Plan:
    """The backend requests answering a chat completion; no choice may ask for more than
    ``max_tokens_cap`` tokens (the caller's), and one that names no length gets at most that."""
    check_chat(request, model.route.max_n)
    tokenizer = model.tokenizer
    output = plan_output(
        request, model.route.tool_call_format, tokenizer.template_text, tokenizer.takes_tools
    )
    messages, tools = conversation(template_messages(request.messages), output)
    prompt = await tokenizer.chat_prompt(messages, tools)
    requested = first_given(request.max_completion_tokens, request.max_tokens)
    max_tokens = resolve_max_tokens(
        requested,
        model.route.defaults.max_tokens,
        prompt,
        model.context_length,
        prompt_param="messages",
        cap=max_tokens_cap,
    )
    logprobs = bool(given(request.logprobs))
    params = sampling_params(
        request,
        model.route.defaults,
        max_tokens=max_tokens,
        logprobs=logprobs,
        guide=output.guide,
    )
    return Plan(
        model=model.name,
        choices=fan_out([prompt], given(request.n) or 1, [params], _rng),
        stream=bool(given(request.stream)),
        include_usage=_include_usage(request),
        logprobs=logprobs,
        output=output,
    )


def _prompts(model: ServedModel, prompt: str | list[Any]) -> list[Awaitable[Prompt]]:
    """Text, texts, token ids or lists of token ids, as OpenAI's ``prompt`` takes them."""
    tokenizer = model.tokenizer
    if isinstance(prompt, str):
        return [tokenizer.text_prompt(prompt)]
    if all(isinstance(item, str) for item in prompt):
        return [tokenizer.text_prompt(item) for item in prompt]
    if all(_is_token(item) for item in prompt):
        return [tokenizer.token_prompt(prompt, "prompt")]
    if all(isinstance(item, list) and item and all(map(_is_token, item)) for item in prompt):
        return [tokenizer.token_prompt(ids, f"prompt[{i}]") for i, ids in enumerate(prompt)]
    raise InvalidRequestError(
        "prompt must be a string, a list of strings, a list of token ids or a list of "
        "non-empty lists of token ids.",
        param="prompt",
    )


def _is_token(item: object) -> bool:
    return isinstance(item, int) and not isinstance(item, bool)


async def plan_completion(
    model: ServedModel, request: CompletionRequest, *, max_tokens_cap: int | None
) -> Plan:
    """The backend requests answering a text completion, ``n`` per prompt, each choice within
    ``max_tokens_cap`` as in ``plan_chat``."""
    check_completion(request, model.route.max_n)
    prompts: list[Prompt] = list(await asyncio.gather(*_prompts(model, request.prompt)))
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
    return Plan(
        model=model.name,
        choices=fan_out(prompts, given(request.n) or 1, params, _rng),
        stream=bool(given(request.stream)),
        include_usage=_include_usage(request),
        logprobs=logprobs,
        echo=bool(given(request.echo)),
    )
