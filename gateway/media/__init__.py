"""Images for vision models: ``data:`` URLs and, where a model allows it, fetched http(s) URLs.

``check_image_url(url, policy)`` fetches or unpacks the image, decodes it within the policy's
limits (in a worker thread) and returns it still encoded (``CheckedImage``: bytes, format,
size), or raises ``ImageError`` with a message for the client. The model's own preprocessing
reads the pixels.
"""

from __future__ import annotations

import asyncio

import httpx

from gateway.media.addresses import (
    HostResolver,
    IPAddress,
    StaticResolver,
    is_public,
    system_resolver,
)
from gateway.media.decode import (
    CheckedImage,
    MediaType,
    check_image,
    data_url_bytes,
)
from gateway.media.fetch import fetch_image
from gateway.media.policy import ImageError, ImagePolicy

__all__ = [
    "CheckedImage",
    "HostResolver",
    "IPAddress",
    "ImageError",
    "ImagePolicy",
    "MediaType",
    "StaticResolver",
    "check_image_url",
    "is_public",
]


async def check_image_url(
    url: str,
    policy: ImagePolicy,
    *,
    resolver: HostResolver = system_resolver,
    transport: httpx.AsyncBaseTransport | None = None,
) -> CheckedImage:
    """The image an ``image_url`` names: fetched or unpacked, decoded in a worker thread within
    the policy's limits, and kept encoded. ``resolver`` and ``transport`` replace name
    resolution and the network in tests."""
    declared, data = await _image_bytes(url, policy, resolver, transport)
    return await asyncio.to_thread(
        check_image, data, max_pixels=policy.max_pixels, declared=declared
    )


async def _image_bytes(
    url: str,
    policy: ImagePolicy,
    resolver: HostResolver,
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
