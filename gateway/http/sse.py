"""Server-sent events framing: the only place that writes ``data:`` lines."""

from __future__ import annotations

import msgspec

CONTENT_TYPE = b"text/event-stream; charset=utf-8"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"
_encoder = msgspec.json.Encoder()


def frame(payload: msgspec.Struct) -> bytes:
    """One event carrying a JSON object."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"
