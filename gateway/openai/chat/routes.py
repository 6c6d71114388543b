"""``POST /v1/chat/completions``."""

from __future__ import annotations

from gateway.openai.bounds import check_chat_bounds
from gateway.openai.chat.plan import plan_chat
from gateway.openai.pipeline import Endpoint, route
from gateway.openai.protocol import ChatCompletionRequest
from gateway.openai.shaping import chat_chunks, chat_completion

CHAT = Endpoint(
    operation="chat",
    schema=ChatCompletionRequest,
    bounds=check_chat_bounds,
    planner=plan_chat,
    id_prefix="chatcmpl",
    chunks=chat_chunks,
    whole=chat_completion,
)

create_chat_completion = route("/v1/chat/completions", CHAT)
"""Answer a conversation, whole or as server-sent events."""
