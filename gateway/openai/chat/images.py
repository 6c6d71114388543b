"""The images of a chat: ``image_url`` content parts checked against the model when the chat is
planned (each refusal a 400 naming ``messages[i].content[j]``), counted in the templated
prompt, and loaded under the model's image rules only once the request is admitted."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from adapters.contract import PromptImage
from gateway.catalog.registry import ServedModel
from gateway.catalog.vision import VisionInputs
from gateway.core.plan import Prompt
from gateway.errors import InvalidRequestError
from gateway.media import ImageError, ImagePolicy, check_image_url
from gateway.openai.protocol import ChatMessage, ContentPart, ImageURL
from gateway.openai.sampling import given

DETAILS = ("auto", "low", "high")
IMAGE_PART = "image_url"
IMAGE_ROLES = ("user",)
"""The roles whose messages may hold images, as OpenAI's chat completions take them."""


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


@dataclass(frozen=True, slots=True)
class ChatImages:
    """A chat's image URLs, checked but not loaded, each with its part's name."""

    urls: tuple[tuple[str, str], ...]
    policy: ImagePolicy

    async def load(self) -> tuple[PromptImage, ...]:
        """The images, fetched where they are URLs and validated; a bad one is a 400 naming
        its part."""
        loaded = await asyncio.gather(
            *(check_image_url(url, self.policy) for _, url in self.urls),
            return_exceptions=True,
        )
        images = []
        for (param, _), result in zip(self.urls, loaded, strict=True):
            if isinstance(result, ImageError):
                raise InvalidRequestError(f"Invalid image: {result.message}", param=param)
            if isinstance(result, BaseException):
                raise result
            images.append(PromptImage(data=result.data, media_type=result.media_type))
        return tuple(images)


def chat_images(
    model: ServedModel, messages: Sequence[ChatMessage], parts: Sequence[tuple[str, ContentPart]]
) -> ChatImages | None:
    """The chat's image ``parts`` (each with its ``messages[i].content[j]`` name), checked
    against the model without loading them; None for a chat without image parts."""
    if model.vision is not None:
        refuse_typed_image_tokens(messages, model.vision)
    if not parts:
        return None
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
    for index, message in enumerate(messages):
        if message.role in IMAGE_ROLES or not isinstance(message.content, list):
            continue
        for part_index, part in enumerate(message.content):
            if part.type == IMAGE_PART:
                raise InvalidRequestError(
                    f"Image parts are taken in user messages only, not in a {message.role} "
                    "message.",
                    param=f"messages[{index}].content[{part_index}]",
                )
    if len(parts) > vision.settings.max_images:
        raise InvalidRequestError(
            f"The request holds {len(parts)} images; the model {model.name!r} takes at most "
            f"{vision.settings.max_images}.",
            param="messages",
        )
    return ChatImages(tuple((param, _url(param, part)) for param, part in parts), policy_of(vision))


def refuse_typed_image_tokens(messages: Sequence[ChatMessage], vision: VisionInputs) -> None:
    """A 400 naming the text that holds the model's image token: only image parts place
    images."""
    token = vision.image_token
    for index, message in enumerate(messages):
        content = message.content
        if isinstance(content, str) and token in content:
            raise _typed_token(token, f"messages[{index}].content")
        if isinstance(content, list):
            for part_index, part in enumerate(content):
                text = given(part.text)
                if isinstance(text, str) and token in text:
                    raise _typed_token(token, f"messages[{index}].content[{part_index}]")


def _typed_token(token: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"The text holds the model's image token {token!r}; send images as image_url parts.",
        param=param,
    )


def counted_images(prompt: Prompt, images: int, vision: VisionInputs) -> Prompt:
    """The templated prompt with each image token counted as the tokens its image becomes;
    a 400 unless the template placed one image token per image."""
    placed = sum(1 for token in prompt.ids if token == vision.image_token_id)
    if placed != images:
        raise InvalidRequestError(
            f"The model's chat template placed {placed} image token(s) for the {images} "
            "image(s) of the conversation, so the images cannot be placed in the prompt.",
            param="messages",
        )
    extra = placed * (vision.tokens_per_image - 1)
    # The images' tokens are the engine's to count: the prompt's count is no longer exact.
    return dataclasses.replace(prompt, token_count=prompt.token_count + extra, exact_count=None)
