"""Images for vision models: ``data:`` URLs and, where a model allows it, fetched http(s) URLs.

``load_image(url, policy)`` returns a ``LoadedImage`` (bytes, format, size, digest, RGB pixels)
or raises ``ImageError`` with a message for the client.
"""

from __future__ import annotations

import asyncio

import httpx

from gateway.media.addresses import (
    IPAddress,
    Resolver,
    StaticResolver,
    is_public,
    system_resolver,
)
from gateway.media.decode import LoadedImage, MediaType, decode_data_url, decode_image
from gateway.media.fetch import fetch_image
from gateway.media.policy import ImageError, ImagePolicy

__all__ = [
    "IPAddress",
    "ImageError",
    "ImagePolicy",
    "LoadedImage",
    "MediaType",
    "Resolver",
    "StaticResolver",
    "is_public",
    "load_image",
]


async def load_image(
    url: str,
    policy: ImagePolicy,
    *,
    resolver: Resolver = system_resolver,
    transport: httpx.AsyncBaseTransport | None = None,
) -> LoadedImage:
    """The image an ``image_url`` names, decoded; ``ImageError`` for anything a client got wrong.

    Decoding runs in a worker thread, so a large image does not stall the event loop.
    ``resolver`` and ``transport`` replace name resolution and the network in tests.
    """
    scheme = url.partition(":")[0].strip().lower() if ":" in url else ""
    if scheme == "data":
        return await asyncio.to_thread(decode_data_url, url, policy)
    if scheme in ("http", "https"):
        if not policy.fetch_http:
            raise ImageError(
                "fetching image URLs is not enabled for this model; send the image inline as "
                "a data: URL (data:image/png;base64,...)"
            )
        data = await fetch_image(url, policy, resolver=resolver, transport=transport)
        return await asyncio.to_thread(decode_image, data, max_pixels=policy.max_pixels)
    shown = scheme or "no scheme"
    raise ImageError(
        f"unsupported image URL scheme {shown!r}; use a data: URL"
        + (" or http(s)" if policy.fetch_http else "")
    )
