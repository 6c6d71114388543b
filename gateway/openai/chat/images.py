"""The images of a chat: ``image_url`` content parts checked against the model and loaded
under its image rules, each refusal a 400 naming ``messages[i].content[j]``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from adapters.contract import PromptImage
from gateway.catalog.registry import ServedModel
from gateway.catalog.vision import VisionInputs
from gateway.http.errors import InvalidRequestError
from gateway.media import ImageError, ImagePolicy, load_image
from gateway.openai.protocol import ChatMessage, ContentPart, ImageURL, given

DETAILS = ("auto", "low", "high")
IMAGE_PART = "image_url"


def image_parts(messages: Sequence[ChatMessage]) -> list[tuple[str, ContentPart]]:
    """Every image part with its ``messages[i].content[j]`` name, in conversation order."""
    found = []
    for index, message in enumerate(messages):
        if isinstance(message.content, list):
            for part_index, part in enumerate(message.content):
                if part.type == IMAGE_PART:
                    found.append((f"messages[{index}].content[{part_index}]", part))
    return found


def policy_of(vision: VisionInputs) -> ImagePolicy:
    """The media loader's policy from the model's image settings."""
    settings = vision.settings
    return ImagePolicy(
        fetch_http=settings.fetch_http,
        allow_private_networks=settings.allow_private_networks,
        max_bytes=settings.max_bytes,
        max_pixels=settings.max_pixels,
        timeout_s=settings.timeout_s,
        max_redirects=settings.max_redirects,
    )


def _url(param: str, part: ContentPart) -> str:
    image = given(part.image_url)
    if isinstance(image, str):
        return image
    if not isinstance(image, ImageURL) or not image.url:
        raise InvalidRequestError("An image_url part needs image_url.url.", param=param)
    detail = given(image.detail)
    if detail is not None and detail not in DETAILS:
        raise InvalidRequestError(
            f"image_url.detail must be one of {', '.join(DETAILS)}, got {detail!r}.",
            param=f"{param}.image_url.detail",
        )
    return image.url


async def chat_images(
    model: ServedModel, messages: Sequence[ChatMessage]
) -> tuple[PromptImage, ...]:
    """The chat's images, loaded; none for a chat without image parts."""
    parts = image_parts(messages)
    if not parts:
        return ()
    vision = model.vision
    if vision is None:
        raise InvalidRequestError(
            f"The model {model.name!r} does not take images: send text content only.",
            param=parts[0][0],
        )
    if model.target.kind == "tensorrt_llm":
        raise InvalidRequestError(
            f"The model {model.name!r} is served through its engine entry, which takes no "
            "images: serve it through its ensemble or BLS.",
            param=parts[0][0],
        )
    if len(parts) > vision.settings.max_images:
        raise InvalidRequestError(
            f"The request holds {len(parts)} images; the model {model.name!r} takes at most "
            f"{vision.settings.max_images}.",
            param="messages",
        )
    urls = [(param, _url(param, part)) for param, part in parts]
    policy = policy_of(vision)
    loaded = await asyncio.gather(
        *(load_image(url, policy) for _, url in urls), return_exceptions=True
    )
    images = []
    for (param, _), result in zip(urls, loaded, strict=True):
        if isinstance(result, ImageError):
            raise InvalidRequestError(f"Invalid image: {result.message}", param=param)
        if isinstance(result, BaseException):
            raise result
        images.append(PromptImage(data=result.data, media_type=result.media_type))
    return tuple(images)
