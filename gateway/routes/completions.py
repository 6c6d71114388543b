"""``POST /v1/completions``."""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.types import ASGIApp

from gateway.planning import plan_completion
from gateway.protocol import CompletionRequest
from gateway.responses import Header, completion_chunks, text_completion
from gateway.routes.answer import Answers
from gateway.transport import decode_body


@post("/v1/completions", status_code=200)
async def create_completion(request: Request[Any, Any, Any], answers: Answers) -> ASGIApp:
    """Complete one or more prompts, whole or as server-sent events."""
    tenant = answers.caller(request)
    body = decode_body(await request.body(), CompletionRequest)
    model = answers.registry.get(body.model, tenant.allows_model, tenant.allows_adapter)
    plan = await answers.plan(request, tenant, model, "text_completion", plan_completion, body)
    header = Header.new("cmpl", model.name)
    return await answers.respond(
        request, tenant, model, plan, header, completion_chunks, text_completion
    )
