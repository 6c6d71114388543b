"""The app: the composition root (``root``), and the OpenAPI document and its page (``openapi``,
``docs``), which know every route."""

from gateway.app.root import WorkerContext, create_app

__all__ = ["WorkerContext", "create_app"]
