"""What a model accepts as an image (its policy), and the one error for what it refuses.

::

    ImageError        anything wrong with an image a client sent or pointed at (a 400)
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


class ImageError(Exception):
    """An image the gateway will not use; the message says why, in the client's terms."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class ImagePolicy:
    """What one model accepts as an image."""

    fetch_http: bool = False
    """Fetch ``http(s)://`` image URLs; without it only ``data:`` URLs are accepted."""
    allow_private_networks: bool = False
    """Let fetches reach loopback, private, link-local and other non-public addresses."""
    max_bytes: int = 20 * MiB
    """The largest encoded image, decoded from base64 or received over HTTP."""
    max_pixels: int = 40_000_000
    """The most pixels (width × height), read from the header before decoding.

    Pillow's process-wide guard still applies above it: twice ``PIL.Image.MAX_IMAGE_PIXELS``
    (about 179 million by default) is refused whatever this says.
    """
    timeout_s: float = 10.0
    """The whole fetch, redirects and name resolution included."""
    max_redirects: int = 3
    """Redirects followed per fetch, each hop checked as the first."""

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_pixels", "timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ImagePolicy.{name} must be positive")
        if self.max_redirects < 0:
            raise ValueError("ImagePolicy.max_redirects must not be negative")
