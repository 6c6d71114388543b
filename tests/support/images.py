"""Test pictures: small images in each format, data: URLs, and PNGs that only claim a size."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from typing import Any

import numpy as np
from PIL import Image


def picture(width: int = 5, height: int = 4, seed: int = 0) -> Image.Image:
    """A deterministic RGB gradient, smooth enough for lossy formats, one per ``seed``."""
    y, x = np.mgrid[0:height, 0:width]
    channels = (x * 23 + seed * 11, y * 31 + seed * 7, (x + y) * 13 + seed * 5)
    pixels = np.stack(channels, axis=-1) % 256
    return Image.fromarray(pixels.astype(np.uint8))


def encode(image: Image.Image, format: str, **options: Any) -> bytes:
    """``image`` saved in a Pillow format ("PNG", "JPEG", "WEBP", "GIF"...)."""
    buffer = io.BytesIO()
    image.save(buffer, format, **options)
    return buffer.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width``×``height`` RGB pixels and whose data holds one row.

    Decoding it fails; only a check that reads the header first refuses it for its size.
    """

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    row = zlib.compress(b"\x00" * (1 + 3 * min(width, 1024)))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", row) + chunk(b"IEND", b"")
