"""Server-sent events framing: the only place that writes ``data:`` lines."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

import msgspec

from gateway.protocol import ErrorEnvelope

logger = logging.getLogger(__name__)
MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"
_encoder = msgspec.json.Encoder()


def frame(payload: msgspec.Struct) -> bytes:
    """One event carrying a JSON object."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"


async def event_stream(
    objects: AsyncGenerator[msgspec.Struct, None],
    error_body: Callable[[Exception], ErrorEnvelope],
) -> AsyncGenerator[bytes, None]:
    """Frame each object, then ``[DONE]``; a failure mid-stream becomes an in-band error event.

    Cancellation (a client that went away) is not a failure: it propagates and nothing more is
    written.
    """
    try:
        async with aclosing(objects):
            async for payload in objects:
                yield frame(payload)
    except Exception as exc:
        yield frame(error_body(exc))
    yield DONE
