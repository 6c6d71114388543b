"""``POST /v1/chat/completions``."""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.types import ASGIApp

from gateway.planning import plan_chat
from gateway.protocol import ChatCompletionRequest
from gateway.responses import Header, chat_chunks, chat_completion
from gateway.routes.answer import Answers
from gateway.transport import decode_body


@post("/v1/chat/completions", status_code=200)
async def create_chat_completion(request: Request[Any, Any, Any], answers: Answers) -> ASGIApp:
    """Answer a conversation, whole or as server-sent events."""
    tenant = answers.caller(request)
    body = decode_body(await request.body(), ChatCompletionRequest)
    model = answers.registry.get(body.model, tenant.allows_model, tenant.allows_adapter)
    plan = await answers.plan(request, tenant, model, "chat", plan_chat, body)
    header = Header.new("chatcmpl", model.name)
    return await answers.respond(request, tenant, model, plan, header, chat_chunks, chat_completion)
