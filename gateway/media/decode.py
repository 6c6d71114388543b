"""Images from bytes: ``data:`` URLs, format sniffing, and limits, checked by decoding.

Only PNG, JPEG and WebP are opened (Pillow is told so, so no other decoder ever sees client
bytes). The pixel count is read from the header and checked before anything is decoded; Pillow's
own decompression-bomb guard (``Image.MAX_IMAGE_PIXELS``, a process-wide setting) is left as it
is and its refusal reported like ours. An animated PNG or WebP is checked by its first frame.
"""

from __future__ import annotations

import base64
import binascii
import io
import struct
from dataclasses import dataclass, field
from typing import Final, Literal

from PIL import Image, UnidentifiedImageError

from gateway.media.policy import ImageError, ImagePolicy

MediaType = Literal["image/png", "image/jpeg", "image/webp"]

FORMATS: Final = ("PNG", "JPEG", "WEBP")
"""The Pillow decoders client bytes may reach."""
_FOUND: Final[dict[str, MediaType]] = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "MPO": "image/jpeg",  # a JPEG carrying more pictures (phone cameras); the first is read
    "WEBP": "image/webp",
}
_DECLARED: Final[dict[str, MediaType]] = {
    "image/png": "image/png",
    "image/jpeg": "image/jpeg",
    "image/jpg": "image/jpeg",
    "image/webp": "image/webp",
}
_UNREADABLE: Final = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error)
"""What Pillow raises on corrupt or truncated data."""


def data_url_bytes(url: str, policy: ImagePolicy) -> tuple[MediaType, bytes]:
    """The declared type and the bytes of a ``data:`` URL, within the policy's size limit."""
    declared, payload = _split_data_url(url)
    if len(payload) > _base64_length(policy.max_bytes):
        raise ImageError(f"the image is larger than the limit of {policy.max_bytes} bytes")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the data: URL's image is not valid base64") from None
    if not data:
        raise ImageError("the data: URL holds no image data")
    if len(data) > policy.max_bytes:
        raise ImageError(f"the image is larger than the limit of {policy.max_bytes} bytes")
    return declared, data


def _split_data_url(url: str) -> tuple[MediaType, str]:
    header, comma, payload = url.partition(",")
    scheme, colon, spec = header.partition(":")
    if scheme.lower() != "data" or not colon or not comma:
        raise ImageError("malformed data: URL; expected data:image/png;base64,<data>")
    media_type, *parameters = (part.strip().lower() for part in spec.split(";"))
    if not parameters or parameters[-1] != "base64":
        raise ImageError("the data: URL must be base64-encoded (data:<type>;base64,<data>)")
    if media_type not in _DECLARED:
        shown = media_type or "no media type"
        raise ImageError(
            f"unsupported image type {shown!r} in data: URL; use image/png, image/jpeg or "
            "image/webp"
        )
    if not payload:
        raise ImageError("the data: URL holds no image data")
    return _DECLARED[media_type], payload


def _base64_length(size: int) -> int:
    """The length of ``size`` bytes in padded base64."""
    return 4 * -(-size // 3)


@dataclass(frozen=True)
class CheckedImage:
    """An image whose bytes decode within the limits, kept encoded (no pixels, no digest)."""

    data: bytes = field(repr=False)
    """The encoded image, as the client sent it or the server answered it."""
    media_type: MediaType
    """The format the decoder found (a declared or served type is not trusted)."""
    width: int
    height: int


def check_image(
    data: bytes,
    *,
    max_pixels: int = ImagePolicy.max_pixels,
    declared: MediaType | None = None,
) -> CheckedImage:
    """PNG, JPEG or WebP bytes checked: format and size from the header, then the whole image
    decoded, so that what reaches the model decodes there too."""
    if not data:
        raise ImageError("the image is empty")
    try:
        media_type, width, height = _inspect(data, max_pixels, declared)
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:
            image.load()
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageError(f"the image has more than the limit of {max_pixels} pixels") from None
    except UnidentifiedImageError:
        raise ImageError("the image is not a PNG, JPEG or WebP image") from None
    except _UNREADABLE as error:
        raise ImageError(f"the image could not be decoded ({error})") from None
    return CheckedImage(data=data, media_type=media_type, width=width, height=height)


def _inspect(
    data: bytes, max_pixels: int, declared: MediaType | None
) -> tuple[MediaType, int, int]:
    """Format and size from the header, and the file's structure verified, before decoding."""
    with Image.open(io.BytesIO(data), formats=FORMATS) as probe:
        media_type = _FOUND.get(str(probe.format))
        if media_type is None:
            raise ImageError("the image is not a PNG, JPEG or WebP image")
        width, height = probe.size
        if declared is not None and declared != media_type:
            raise ImageError(f"the image is declared as {declared} but is {media_type}")
        if width <= 0 or height <= 0:
            raise ImageError("the image has no pixels")
        if width * height > max_pixels:
            raise ImageError(
                f"the image is {width}x{height}, more than the limit of {max_pixels} pixels"
            )
        probe.verify()
    return media_type, width, height
