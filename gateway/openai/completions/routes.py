"""``POST /v1/completions``."""

from __future__ import annotations

from gateway.openai.bounds import check_completion_bounds
from gateway.openai.completions.plan import plan_completion
from gateway.openai.pipeline import Endpoint, route
from gateway.openai.protocol import CompletionRequest
from gateway.openai.shaping import completion_chunks, text_completion

TEXT = Endpoint(
    operation="text_completion",
    schema=CompletionRequest,
    bounds=check_completion_bounds,
    planner=plan_completion,
    id_prefix="cmpl",
    chunks=completion_chunks,
    whole=text_completion,
)

create_completion = route("/v1/completions", TEXT)
"""Complete one or more prompts, whole or as server-sent events."""
