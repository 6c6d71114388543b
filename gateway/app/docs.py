"""The OpenAPI document and a page that renders it, with Swagger UI served from its wheel."""

from __future__ import annotations

import importlib.util
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from litestar import MediaType, Request, Response, get
from litestar.exceptions import NotFoundException

from gateway.app.openapi import docs_page, document
from gateway.tenancy.service import Tenancy

# The Swagger UI files the page loads, from the swagger-ui-py wheel: no CDN, so the page works
# on hosts without network.
ASSETS = {
    "swagger-ui.css": "text/css; charset=utf-8",
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "favicon-32x32.png": "image/png",
}


@cache
def _document(admin: bool) -> dict[str, Any]:
    try:
        release = version("triton-gateway")
    except PackageNotFoundError:
        release = "0"
    return document(release, admin=admin)


@cache
def _asset(name: str) -> bytes:
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise NotFoundException("Swagger UI is not installed (pip package swagger-ui-py)")
    return (Path(spec.submodule_search_locations[0]) / "static" / name).read_bytes()


@get("/openapi.json", media_type=MediaType.JSON)
async def openapi_json(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """This API's OpenAPI 3.1 document: the admin API's routes only for the admin key."""
    tenancy: Tenancy = request.app.state.runtime.tenancy
    return _document(tenancy.is_admin(request.headers))


@get("/docs", media_type=MediaType.HTML)
async def docs(request: Request[Any, Any, Any]) -> str:
    """A page rendering the OpenAPI document, at ``/docs`` and ``/docs/``."""
    # The router answers both paths here; the one asked for is the raw path's.
    raw: bytes = request.scope.get("raw_path") or request.url.path.encode()
    return docs_page(raw.decode("latin-1"))


@get("/docs/assets/{name:str}", include_in_schema=False)
async def docs_asset(name: str) -> Response[bytes]:
    """One of the page's Swagger UI files."""
    if name not in ASSETS:
        raise NotFoundException(f"no asset {name!r}")
    return Response(
        _asset(name), media_type=ASSETS[name], headers={"Cache-Control": "max-age=86400"}
    )
