"""The routers' gate: what every route of the API and admin routers gets before its handler,
from this one place. A request with a method its route does not take is a 405; while draining,
any other is refused with a 503 that sends it elsewhere; an ``OPTIONS`` is answered with the
route's methods.

The framework does the first and the last itself for its own handlers; the completion routes
are plain ASGI handlers (``gateway.openai.pipeline.route``), which it does not dispatch by
method, so the gate does it for them from the methods they declare, in the framework's order
(the 405 before the refusal, as its router raises it before any middleware runs).
"""

from __future__ import annotations

from typing import Any

from litestar.exceptions import MethodNotAllowedException
from litestar.handlers import ASGIRouteHandler
from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.runtime.base import Runtime


def gate(app: ASGIApp) -> ASGIApp:
    """The gate around one route's handler (a litestar middleware factory)."""

    async def gated(scope: Scope, receive: Receive, send: Send) -> None:
        methods = _declared_methods(scope.get("route_handler"))
        method = scope.get("method", "")
        if methods is not None and method not in methods:
            raise MethodNotAllowedException(headers={"allow": ", ".join(methods)})
        runtime: Runtime = scope["litestar_app"].state.runtime
        runtime.lifecycle.refuse_if_draining(runtime.settings.limits.retry_after_s)
        if methods is not None and method == "OPTIONS":
            allow = [(b"allow", ", ".join(methods).encode())]
            await send({"type": "http.response.start", "status": 204, "headers": allow})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await app(scope, receive, send)

    return gated


def _declared_methods(handler: Any) -> tuple[str, ...] | None:
    """The methods a plain ASGI route declares; ``None`` for the framework's own handlers."""
    if isinstance(handler, ASGIRouteHandler):
        methods: tuple[str, ...] = handler.opt["methods"]
        return methods
    return None
