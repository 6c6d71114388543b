"""The shared last step of both completion routes: stream the plan's events or collect them."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

import msgspec
from litestar import Request, Response

from gateway.generation import ChoiceResult, Event, GenerationService
from gateway.registry import ServedModel
from gateway.responses import Header
from gateway.settings import Settings
from gateway.translate import Plan
from gateway.transport import stream_response, until_disconnect

Chunks = Callable[[Plan, AsyncGenerator[Event, None], Header], AsyncGenerator[Any, None]]
Whole = Callable[[Plan, list[ChoiceResult], Header], msgspec.Struct]


async def answer(
    request: Request[Any, Any, Any],
    model: ServedModel,
    plan: Plan,
    header: Header,
    generation: GenerationService,
    settings: Settings,
    *,
    chunks: Chunks,
    whole: Whole,
) -> Response[Any]:
    """Server-sent events when the plan streams, one JSON answer otherwise."""
    if plan.stream:
        stream = chunks(plan, generation.events(model, plan), header)
        return await stream_response(
            request.receive, stream, retry_after_s=settings.limits.retry_after_s
        )
    results = await until_disconnect(request.receive, generation.collect(model, plan))
    return Response(whole(plan, results, header))
