"""Plan a chat or text completion: validate, template, count tokens, fan out choices."""

from __future__ import annotations

import asyncio
import random

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


async def plan_chat(model: ServedModel, request: ChatCompletionRequest) -> Plan:
    """The backend requests answering a chat completion."""
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


async def plan_completion(model: ServedModel, request: CompletionRequest) -> Plan:
    """The backend requests answering a text completion, ``n`` per prompt."""
    check_completion(request, model.route.max_n)
    texts = [request.prompt] if isinstance(request.prompt, str) else request.prompt
    prompts: list[Prompt] = list(
        await asyncio.gather(*(model.tokenizer.text_prompt(text) for text in texts))
    )
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
