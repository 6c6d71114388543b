"""``POST /v1/chat/completions``."""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.types import ASGIApp

from gateway.openai.chat.plan import plan_chat
from gateway.openai.chat.shape import chat_chunks, chat_completion
from gateway.openai.pipeline import CompletionPipeline, Endpoint
from gateway.openai.protocol import ChatCompletionRequest

CHAT = Endpoint(
    operation="chat",
    schema=ChatCompletionRequest,
    planner=plan_chat,
    id_prefix="chatcmpl",
    chunks=chat_chunks,
    whole=chat_completion,
)


@post("/v1/chat/completions", status_code=200)
async def create_chat_completion(
    request: Request[Any, Any, Any], pipeline: CompletionPipeline
) -> ASGIApp:
    """Answer a conversation, whole or as server-sent events."""
    return await pipeline.answer(request, CHAT)
