"""What the request path learns about one request, for its log line, metrics and span."""

from __future__ import annotations

import logging
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from gateway.ids import random_hex

REQUEST_ID_HEADER = "x-request-id"
SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""The client ids taken as they are: no spaces, ``=`` or quotes, so one cannot write fields of
its own (``tenant=team-a``) into a log line or change the Triton request id's shape."""
logger = logging.getLogger(__name__)


@dataclass(eq=False)
class RequestRecord:
    """One HTTP request as observed: set by the middleware, filled in by the request path."""

    request_id: str
    method: str
    route: str
    start: float = field(default_factory=time.monotonic)
    model: str = ""
    adapter: str = ""
    tenant: str = ""
    status: int = 500
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_s: float | None = None
    queue_s: float | None = None
    error: str = ""
    trace_headers: dict[str, str] = field(default_factory=dict)
    """The client's W3C trace context headers."""
    span: Any = None
    """The request's root span (a no-op span when tracing is off)."""

    @property
    def generates(self) -> bool:
        """Whether the request reached a model (completion routes past model lookup)."""
        return bool(self.model)

    @property
    def labels(self) -> tuple[str, str, str]:
        """``model``, ``adapter`` and ``tenant`` label values, all from configuration."""
        return self.model, self.adapter, self.tenant

    def elapsed(self) -> float:
        """Seconds since the request arrived."""
        return time.monotonic() - self.start


_current: ContextVar[RequestRecord | None] = ContextVar("gateway_request", default=None)


def current() -> RequestRecord | None:
    """The record of the request being answered in this context, if any."""
    return _current.get()


def begin(record: RequestRecord) -> Any:
    """Make ``record`` current; returns the token ``end`` takes."""
    return _current.set(record)


def end(token: Any) -> None:
    """Restore the context ``begin`` changed."""
    _current.reset(token)


def request_id_from(headers: dict[str, str]) -> str:
    """The client's ``X-Request-ID`` when ``SAFE_REQUEST_ID`` matches all of it, else a new one
    (the refused value is logged escaped, and shortened)."""
    given = headers.get(REQUEST_ID_HEADER)
    if given is not None and SAFE_REQUEST_ID.fullmatch(given):
        return given
    generated = random_hex(16)
    if given is not None:
        logger.info(
            "X-Request-ID %s refused (allowed: %s); request id %s instead",
            ascii(given[:256]),
            SAFE_REQUEST_ID.pattern,
            generated,
        )
    return generated
