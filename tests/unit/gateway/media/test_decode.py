"""Images from data: URLs: formats, modes, limits, and everything refused."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from gateway.media import CheckedImage, ImageError, ImagePolicy, check_image_url
from tests.support.images import data_url, encode, picture, png_claiming

POLICY = ImagePolicy()


async def load(url: str, policy: ImagePolicy = POLICY) -> CheckedImage:
    return await check_image_url(url, policy)


@pytest.mark.parametrize(
    ("format", "declared", "options"),
    [
        ("PNG", "image/png", {}),
        ("JPEG", "image/jpeg", {"quality": 95, "subsampling": 0}),
        ("JPEG", "image/jpg", {"quality": 95, "subsampling": 0}),
        ("WEBP", "image/webp", {"lossless": True}),
        ("WEBP", "image/webp", {"quality": 90}),
    ],
)
async def test_each_format_is_checked_and_kept_as_sent(
    format: str, declared: str, options: dict[str, object]
) -> None:
    data = encode(picture(7, 3), format, **options)
    image = await load(data_url(data, declared))
    media_type = {"PNG": "image/png", "JPEG": "image/jpeg"}.get(format, "image/webp")
    assert image == CheckedImage(data=data, media_type=media_type, width=7, height=3)
    assert "data=" not in repr(image)


def _palette_with_transparency() -> Image.Image:
    image = Image.new("P", (2, 1))
    image.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    image.putdata([0, 1])
    image.info["transparency"] = 1
    return image


@pytest.mark.parametrize(
    ("image", "format"),
    [
        (Image.new("RGBA", (2, 1), (255, 0, 0, 0)), "PNG"),
        (Image.new("LA", (2, 1), (0, 0)), "PNG"),
        (Image.new("L", (2, 1), 77), "PNG"),
        (Image.new("1", (2, 1), 1), "PNG"),
        (Image.new("I;16", (2, 1), 0x8000), "PNG"),
        (Image.new("RGB", (2, 1), (10, 200, 30)).quantize(4), "PNG"),
        (_palette_with_transparency(), "PNG"),
        (Image.new("RGBA", (2, 1), (0, 255, 0, 0)), "WEBP"),
        (Image.new("L", (8, 8), 200), "JPEG"),
        (Image.new("CMYK", (8, 8), (0, 255, 255, 0)), "JPEG"),
    ],
    ids=lambda value: getattr(value, "mode", str(value)),
)
async def test_every_mode_is_taken(image: Image.Image, format: str) -> None:
    media_type = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}[format]
    options = {"lossless": True} if format == "WEBP" else {}
    checked = await load(data_url(encode(image, format, **options), media_type))
    assert (checked.width, checked.height) == image.size


@pytest.mark.parametrize(("format", "media_type"), [("PNG", "image/png"), ("WEBP", "image/webp")])
async def test_an_animated_image_is_taken(format: str, media_type: str) -> None:
    frames = [Image.new("RGB", (4, 4), color) for color in ((250, 0, 0), (0, 250, 0))]
    options = {"lossless": True} if format == "WEBP" else {}
    data = encode(frames[0], format, save_all=True, append_images=frames[1:], **options)
    with Image.open(io.BytesIO(data)) as check:
        assert getattr(check, "n_frames", 1) == 2
    checked = await load(data_url(data, media_type))
    assert (checked.media_type, checked.width, checked.height) == (media_type, 4, 4)


PNG = encode(picture(), "PNG")
B64 = base64.b64encode(PNG).decode("ascii")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:image/png," + B64, "base64"),
        ("data:image/png;charset=utf-8," + B64, "base64"),
        ("data:image/gif;base64," + B64, "unsupported image type 'image/gif'"),
        ("data:text/plain;base64," + B64, "unsupported image type"),
        ("data:;base64," + B64, "no media type"),
        ("data:image/png;base64", "malformed data: URL"),
        ("data:image/png;base64,", "no image data"),
        ("data:image/png;base64," + B64[:-1], "not valid base64"),
        ("data:image/png;base64," + B64[:8] + "\n" + B64[8:], "not valid base64"),
        ("data:image/png;base64," + B64.replace("+", "-").replace("/", "_") + "-_", "base64"),
        ("data:image/png;base64," + B64[:8] + "é" + B64[8:], "not valid base64"),
        ("data:image/jpeg;base64," + B64, "declared as image/jpeg but is image/png"),
        ("data:image/webp;base64," + B64, "declared as image/webp but is image/png"),
        (data_url(b"plain text, not a picture"), "not a PNG, JPEG or WebP"),
        (data_url(encode(picture(), "GIF")), "not a PNG, JPEG or WebP"),
        (data_url(encode(picture(), "BMP")), "not a PNG, JPEG or WebP"),
        (data_url(encode(picture(), "TIFF")), "not a PNG, JPEG or WebP"),
    ],
)
async def test_bad_data_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(ImageError, match=message.replace("(", r"\(")):
        await load(url)


@pytest.mark.parametrize(
    ("format", "media_type", "keep"),
    [
        ("PNG", "image/png", 0.5),
        ("PNG", "image/png", 0.95),
        ("JPEG", "image/jpeg", 0.5),
        ("WEBP", "image/webp", 0.5),
    ],
)
async def test_truncated_images_are_refused(format: str, media_type: str, keep: float) -> None:
    data = encode(picture(64, 64), format)
    with pytest.raises(ImageError, match="decoded"):
        await load(data_url(data[: int(len(data) * keep)], media_type))


async def test_a_corrupt_png_is_refused() -> None:
    data = bytearray(encode(picture(32, 32), "PNG"))
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(ImageError, match="decoded"):
        await load(data_url(bytes(data)))


@pytest.mark.parametrize(
    ("width", "height"),
    [
        (8000, 6000),  # over the policy's 40 million, under Pillow's own guard
        (10_000, 10_000),  # over Pillow's warning threshold
        (40_000, 40_000),  # over Pillow's hard limit
        (1, 2**31 - 1),
    ],
)
async def test_a_decompression_bomb_is_refused_from_its_header(width: int, height: int) -> None:
    before = Image.MAX_IMAGE_PIXELS
    with pytest.raises(ImageError, match="pixels"):
        await load(data_url(png_claiming(width, height)))
    assert before == Image.MAX_IMAGE_PIXELS


async def test_the_pixel_limit_is_the_policys() -> None:
    url = data_url(encode(picture(20, 20), "PNG"))
    assert (await load(url, ImagePolicy(max_pixels=400))).width == 20
    with pytest.raises(ImageError, match="20x20, more than the limit of 399 pixels"):
        await load(url, ImagePolicy(max_pixels=399))


async def test_the_byte_limit_is_exact() -> None:
    data = encode(picture(), "PNG")
    assert (await load(data_url(data), ImagePolicy(max_bytes=len(data)))).data == data
    with pytest.raises(ImageError, match=f"limit of {len(data) - 1} bytes"):
        await load(data_url(data), ImagePolicy(max_bytes=len(data) - 1))


async def test_oversized_base64_is_refused_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("the base64 text was decoded")

    monkeypatch.setattr(base64, "b64decode", refuse)
    with pytest.raises(ImageError, match="larger than the limit of 1024 bytes"):
        await load("data:image/png;base64," + "A" * 1372, ImagePolicy(max_bytes=1024))


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "ftp://example.com/a.png", "gopher://example.com/", "a.png", ""],
)
@pytest.mark.parametrize("fetch_http", [False, True])
async def test_other_schemes_are_refused(url: str, fetch_http: bool) -> None:
    with pytest.raises(ImageError, match="unsupported image URL scheme"):
        await load(url, ImagePolicy(fetch_http=fetch_http))


@pytest.mark.parametrize("url", ["http://example.com/a.png", "HTTPS://example.com/a.png"])
async def test_http_urls_need_the_models_consent(url: str) -> None:
    with pytest.raises(ImageError, match="fetching image URLs is not enabled for this model"):
        await load(url)


@pytest.mark.parametrize(
    "fields",
    [{"max_bytes": 0}, {"max_pixels": -1}, {"timeout_s": 0}, {"max_redirects": -1}],
)
def test_a_policy_refuses_impossible_limits(fields: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="ImagePolicy"):
        ImagePolicy(**fields)  # type: ignore[arg-type]
