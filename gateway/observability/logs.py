"""Logging: plain text or one JSON object per line, every line of a request with its id.

The access line (logger ``gateway.access``) says what a request did (route, status, model,
adapter, tenant, tokens, timings) and never what it said: no prompt or completion text.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Literal

from gateway.observability.record import RequestRecord, current_request

access_logger = logging.getLogger("gateway.access")
LogFormat = Literal["text", "json"]
_IN_FRONT = frozenset({"request_id", "method", "route", "status"})
"""Access fields the line starts with (or, the id, ends with) rather than lists as ``key=value``."""
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
PROBES_AND_SCRAPES = frozenset(
    {"/health/live", "/health/ready", "/metrics", "/metrics/sidecars/{name}"}
)
"""Routes a load balancer or Prometheus calls every few seconds: their access lines are DEBUG."""
CHATTY_LIBRARIES = ("httpx", "httpcore")
"""Libraries that log every HTTP call at INFO: the gateway's probes of its replicas and scrapes
of their metrics, several a second. They log at WARNING unless the level asked is DEBUG."""


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record logged while a request is being answered."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = current_request.get()
        if not hasattr(record, "request_id"):
            record.request_id = request.request_id if request is not None else None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id and any extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(
            (key, value)
            for key, value in record.__dict__.items()
            if key not in _STANDARD and value is not None
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """The plain format, with ``[request id]`` when there is one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request_id = getattr(record, "request_id", None)
        return f"{text} [{request_id}]" if request_id else text


def configure_logging(level: str, log_format: LogFormat) -> None:
    """Route every logger (uvicorn's too) through one handler in the chosen format."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    # Neither format shows where a line was logged from, nor its thread or process: not
    # looking them up (the logging docs' "Optimization") saves a third of every line's cost.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    # The access line below replaces uvicorn's own.
    logging.getLogger("uvicorn.access").disabled = True
    quiet = logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(quiet)


def log_access(record: RequestRecord, seconds: float) -> None:
    """The line that sums up one answered request."""
    fields: dict[str, Any] = {
        "request_id": record.request_id,
        "method": record.method,
        "route": record.route,
        "status": record.status,
        "duration_ms": round(seconds * 1000, 2),
    }
    if record.generates:
        fields.update(
            model=record.model,
            adapter=record.adapter or None,
            tenant=record.tenant or None,
            prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens,
        )
        if record.first_token_s is not None:
            fields["ttft_ms"] = round(record.first_token_s * 1000, 2)
    if record.error:
        fields["error"] = record.error
    text = " ".join(
        f"{key}={value}"
        for key, value in fields.items()
        if value is not None and key not in _IN_FRONT
    )
    level = logging.DEBUG if record.route in PROBES_AND_SCRAPES else logging.INFO
    access_logger.log(
        level, "%s %s %s %s", record.method, record.route, record.status, text, extra=fields
    )
