"""Image parts checked by the gateway without a running Triton: the image token typed in text,
images outside user messages, templates that drop images, completions holding the image token,
and rate limiting before any image is fetched or decoded."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient
from PIL import Image

from adapters.triton.client import TritonBackend
from gateway.app import create_app
from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings, TenantPolicy
from tests.unit.gateway.test_app import closed_port

TOKENS_PER_IMAGE = 16
TEXT_ONLY_TEMPLATE = (
    "{%- for message in messages -%}{{- message.role + ': ' -}}"
    "{%- if message.content is string -%}{{- message.content -}}{%- else -%}"
    "{%- for part in message.content -%}{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}{{- '\\n' -}}{%- endfor -%}"
)
"""A chat template that takes content lists but renders no image token."""


@pytest.fixture(scope="module")
def vision_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llava's tokenizer, template and ``config.json`` (the gateway reads no weights)."""
    from deploy.sidecar.tiny import portable_tokenizer_config, train_tokenizer
    from deploy.sidecar.vision_model import (
        IMAGE_SIZE,
        IMAGE_TOKEN,
        PATCH_SIZE,
        VISION_CHAT_TEMPLATE,
    )

    path = tmp_path_factory.mktemp("vision-tokenizer")
    tokenizer = train_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    portable_tokenizer_config(path, model_max_length=4096)
    config = {
        "model_type": "llava",
        "image_token_index": tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        "vision_feature_select_strategy": "default",
        "vision_config": {"image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE},
        "text_config": {"vocab_size": len(tokenizer)},
    }
    (path / "config.json").write_text(json.dumps(config))
    (path / "text_only.jinja").write_text(TEXT_ONLY_TEMPLATE)
    assert (IMAGE_SIZE // PATCH_SIZE) ** 2 == TOKENS_PER_IMAGE
    return path


def _app(vision_dir: Path, anonymous: TenantPolicy) -> Any:
    port = closed_port()

    def model(name: str, **extra: Any) -> ModelSettings:
        return ModelSettings(
            name=name,
            triton_url=f"127.0.0.1:{port}",
            triton_model="vis_ensemble",
            tokenizer_dir=str(vision_dir),
            context_length=64,
            **extra,
        )

    settings = Settings(
        models=(
            model("vis"),
            model("vis-text-template", chat_template=str(vision_dir / "text_only.jinja")),
        ),
        limits=LimitSettings(request_timeout_s=10),
        tenancy=TenancySettings(auth=False, anonymous=anonymous),
    )
    return create_app(settings, backend_factory=lambda routes: TritonBackend(connect_timeout_s=1))


@pytest.fixture(scope="module")
def client(vision_dir: Path) -> Iterator[TestClient[Any]]:
    with TestClient(_app(vision_dir, TenantPolicy(name="anonymous"))) as test_client:
        yield test_client


def _png() -> str:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


IMAGE = {"type": "image_url", "image_url": {"url": _png(), "detail": "high"}}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _chat(client: TestClient[Any], messages: list[dict[str, Any]], **extra: Any) -> Any:
    body = {"model": "vis", "max_tokens": 2, "messages": messages, **extra}
    return client.post("/v1/chat/completions", json=body)


def _refused(response: Any) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        (
            [{"role": "user", "content": [_text("look: <image>")]}],
            "messages[0].content[0]",
            "<image>",
        ),
        ([{"role": "user", "content": "a typed <image> token"}], "messages[0].content", "<image>"),
        (
            [{"role": "user", "content": [IMAGE, _text("and <image> here")]}],
            "messages[0].content[1]",
            "<image>",
        ),
        (
            [
                {"role": "system", "content": [_text("Look."), IMAGE]},
                {"role": "user", "content": "Hi"},
            ],
            "messages[0].content[1]",
            "user messages",
        ),
        (
            [
                {"role": "user", "content": [IMAGE, _text("What is it?")]},
                {"role": "assistant", "content": [IMAGE]},
                {"role": "user", "content": "And now?"},
            ],
            "messages[1].content[0]",
            "user messages",
        ),
    ],
    ids=[
        "typed-in-part",
        "typed-in-string",
        "typed-beside-image",
        "system-image",
        "assistant-image",
    ],
)
def test_image_tokens_only_from_user_image_parts(
    client: TestClient[Any], messages: list[dict[str, Any]], param: str, words: str
) -> None:
    error = _refused(_chat(client, messages))
    assert error["param"] == param
    assert words in error["message"]


def test_a_template_that_drops_images_is_a_400_on_messages(client: TestClient[Any]) -> None:
    error = _refused(
        _chat(
            client, [{"role": "user", "content": [IMAGE, _text("Hi")]}], model="vis-text-template"
        )
    )
    assert error["param"] == "messages"
    assert "0 image token" in error["message"] and "1 image" in error["message"]


def test_images_count_in_the_context_check(client: TestClient[Any]) -> None:
    """Five images take 80 tokens: more than the 64-token context."""
    content = [IMAGE, IMAGE, IMAGE, IMAGE, IMAGE, _text("Hi")]
    error = _refused(_chat(client, [{"role": "user", "content": content}]))
    assert error["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    ("prompt", "param"),
    [("a typed <image>", "prompt"), (["fine", "typed <image>"], "prompt[1]")],
    ids=["text", "texts"],
)
def test_completions_refuse_the_image_token(
    client: TestClient[Any], prompt: Any, param: str
) -> None:
    body = {"model": "vis", "max_tokens": 2, "prompt": prompt}
    error = _refused(client.post("/v1/completions", json=body))
    assert error["param"] == param
    assert "<image>" in error["message"]


def test_completions_refuse_the_image_token_id(client: TestClient[Any], vision_dir: Path) -> None:
    image_id = json.loads((vision_dir / "config.json").read_text())["image_token_index"]
    body = {"model": "vis", "max_tokens": 2, "prompt": [72, image_id, 73]}
    assert _refused(client.post("/v1/completions", json=body))["param"] == "prompt"


def test_images_are_loaded_only_after_admission(vision_dir: Path) -> None:
    """Over its limit, a request with an undecodable image is a 429: nothing was decoded."""
    policy = TenantPolicy(name="anonymous", requests_per_minute=1)
    undecodable = {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"no image").decode()},
    }
    messages = [{"role": "user", "content": [undecodable, _text("Hi")]}]
    with TestClient(_app(vision_dir, policy)) as limited:
        first = _chat(limited, messages)
        assert first.status_code == 400, first.text
        assert first.json()["error"]["param"] == "messages[0].content[0]"
        second = _chat(limited, messages)
        assert second.status_code == 429, second.text
