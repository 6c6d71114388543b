"""``POST /v1/completions``."""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.types import ASGIApp

from gateway.openai.completions.plan import plan_completion
from gateway.openai.completions.shape import completion_chunks, text_completion
from gateway.openai.pipeline import CompletionPipeline, Endpoint
from gateway.openai.protocol import CompletionRequest

TEXT = Endpoint(
    operation="text_completion",
    schema=CompletionRequest,
    planner=plan_completion,
    id_prefix="cmpl",
    chunks=completion_chunks,
    whole=text_completion,
)


@post("/v1/completions", status_code=200)
async def create_completion(
    request: Request[Any, Any, Any], pipeline: CompletionPipeline
) -> ASGIApp:
    """Complete one or more prompts, whole or as server-sent events."""
    return await pipeline.answer(request, TEXT)
