"""``POST /v1/completions``."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post

from gateway.generation import GenerationService
from gateway.planning import plan_completion
from gateway.protocol import CompletionRequest
from gateway.registry import ModelRegistry
from gateway.responses import Header, completion_chunks, text_completion
from gateway.settings import Settings
from gateway.transport import decode_body, stream_response, until_disconnect


@post("/v1/completions", status_code=200)
async def create_completion(
    request: Request[Any, Any, Any],
    registry: ModelRegistry,
    generation: GenerationService,
    settings: Settings,
) -> Response[Any]:
    """Complete one or more prompts, whole or as server-sent events."""
    body = decode_body(await request.body(), CompletionRequest)
    model = registry.get(body.model)
    plan = await until_disconnect(request.receive, plan_completion(model, body))
    header = Header.new("cmpl", model.name)
    if plan.stream:
        chunks = completion_chunks(plan, generation.events(model, plan), header)
        return await stream_response(
            request.receive, chunks, retry_after_s=settings.limits.retry_after_s
        )
    results = await until_disconnect(request.receive, generation.collect(model, plan))
    return Response(text_completion(plan, results, header))
