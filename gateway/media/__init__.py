"""Images for vision models: ``data:`` URLs and, where a model allows it, fetched http(s) URLs.

``load_image(url, policy)`` returns a ``LoadedImage`` (bytes, format, size, digest, RGB pixels)
or raises ``ImageError`` with a message for the client; ``check_image_url(url, policy)`` checks
the image the same way and returns it still encoded (``CheckedImage``).
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
from gateway.media.decode import (
    CheckedImage,
    LoadedImage,
    MediaType,
    check_image,
    data_url_bytes,
    decode_image,
)
from gateway.media.fetch import fetch_image
from gateway.media.policy import ImageError, ImagePolicy

__all__ = [
    "CheckedImage",
    "IPAddress",
    "ImageError",
    "ImagePolicy",
    "LoadedImage",
    "MediaType",
    "Resolver",
    "StaticResolver",
    "check_image_url",
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
    declared, data = await _image_bytes(url, policy, resolver, transport)
    return await asyncio.to_thread(
        decode_image, data, max_pixels=policy.max_pixels, declared=declared
    )


async def check_image_url(
    url: str,
    policy: ImagePolicy,
    *,
    resolver: Resolver = system_resolver,
    transport: httpx.AsyncBaseTransport | None = None,
) -> CheckedImage:
    """The image an ``image_url`` names, checked as ``load_image`` checks it (fetched, decoded
    in a worker thread, within the limits) but kept encoded: no RGB pixels, no digest."""
    declared, data = await _image_bytes(url, policy, resolver, transport)
    return await asyncio.to_thread(
        check_image, data, max_pixels=policy.max_pixels, declared=declared
    )


async def _image_bytes(
    url: str,
    policy: ImagePolicy,
    resolver: Resolver,
    transport: httpx.AsyncBaseTransport | None,
) -> tuple[MediaType | None, bytes]:
    """The declared type (of a ``data:`` URL) and the encoded bytes an ``image_url`` names."""
    scheme = url.partition(":")[0].strip().lower() if ":" in url else ""
    if scheme == "data":
        return data_url_bytes(url, policy)
    if scheme in ("http", "https"):
        if not policy.fetch_http:
            raise ImageError(
                "fetching image URLs is not enabled for this model; send the image inline as "
                "a data: URL (data:image/png;base64,...)"
            )
        return None, await fetch_image(url, policy, resolver=resolver, transport=transport)
    shown = scheme or "no scheme"
    raise ImageError(
        f"unsupported image URL scheme {shown!r}; use a data: URL"
        + (" or http(s)" if policy.fetch_http else "")
    )
