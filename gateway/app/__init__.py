"""The app: the composition root (``root``), the routers' gate (``gate``), and the OpenAPI
document and its page (``openapi``, ``docs``), which know every route."""

from gateway.app.root import WorkerContext, create_app

__all__ = ["WorkerContext", "create_app"]
