"""The OpenAPI document and a page that renders it."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from litestar import MediaType, get

from gateway.openapi import DOCS_PAGE, document


@cache
def _document() -> dict[str, Any]:
    try:
        release = version("triton-gateway")
    except PackageNotFoundError:
        release = "0"
    return document(release)


@get("/openapi.json", media_type=MediaType.JSON)
async def openapi_json() -> dict[str, Any]:
    """This API's OpenAPI 3.1 document."""
    return _document()


@get("/docs", media_type=MediaType.HTML)
async def docs() -> str:
    """A page rendering the OpenAPI document."""
    return DOCS_PAGE
