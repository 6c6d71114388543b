"""Images through the gateway to the tiny Llava: greedy output equal to transformers' on the same
image and text through our ensemble, our BLS and the stock v0.19 BLS, streamed and not; two
images in a message; KV reuse keyed by image content; the openai SDK's and LangChain's image
parts; and every refused image a 400 naming its part."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.settings import ImageSettings, LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.support.gateway import LiveGateway
from tests.support.vision import (
    PIPELINE,
    STOCK_BLS,
    Reference,
    data_url,
    png_bytes,
    sample_image,
    vision_sidecar,
)

pytestmark = pytest.mark.slow

QUESTION = "What is in this picture?"
MAX_TOKENS = 12
ENTRIES = {
    "vis": (f"{PIPELINE}_ensemble", "ensemble"),
    "vis-bls": (f"{PIPELINE}_tensorrt_llm_bls", "tensorrt_llm_bls"),
    "vis-stock-bls": (STOCK_BLS, "tensorrt_llm_bls"),
}


@pytest.fixture(scope="module")
def vision_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from deploy.sidecar.vision_model import build_tiny_vision_model

    return build_tiny_vision_model(tmp_path_factory.mktemp("models") / "tiny-vision")


@pytest.fixture(scope="module")
def reference(vision_dir: Path) -> Reference:
    return Reference(vision_dir)


@pytest.fixture(scope="module")
def gateway(
    vision_dir: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A gateway over one sidecar serving the tiny Llava's ensemble, BLS and the stock BLS,
    plus models with other image rules and a text-only one (the tiny Llama's tokenizer)."""
    sidecar = vision_sidecar(vision_dir, tmp_path_factory.mktemp("vision"))
    sidecar.start()

    def model(name: str, triton_model: str, entry: str, **extra: Any) -> ModelSettings:
        return ModelSettings(
            name=name,
            triton_url=sidecar.grpc_url,
            triton_model=triton_model,
            entry=entry,  # type: ignore[arg-type]
            tokenizer_dir=str(extra.pop("tokenizer_dir", vision_dir)),
            **extra,
        )

    models = [model(name, *entry) for name, entry in ENTRIES.items()]
    models += [
        model("vis-engine", f"{PIPELINE}_tensorrt_llm", "tensorrt_llm"),
        model("vis-small", *ENTRIES["vis"], images=ImageSettings(max_bytes=64, max_images=2)),
        model("vis-fetch", *ENTRIES["vis"], images=ImageSettings(fetch_http=True)),
        model("text-only", *ENTRIES["vis"], tokenizer_dir=tiny_model_dir),
    ]
    settings = Settings(
        models=tuple(models),
        limits=LimitSettings(request_timeout_s=60.0, shutdown_grace_s=5.0),
        tenancy=TenancySettings(auth=False),
    )
    live = LiveGateway(settings).start()
    try:
        yield live.url
    finally:
        live.stop()
        sidecar.stop()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _image_part(image: Any, detail: str = "auto") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(image), "detail": detail}}


def _chat(url: str, model: str, content: list[dict[str, Any]], stream: bool) -> tuple[str, Any]:
    client = _client(url)
    messages: Any = [{"role": "user", "content": content}]
    if not stream:
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        return answer.choices[0].message.content or "", answer.usage
    chunks = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    return text, usage


def _expected(reference: Reference, images: list[Any], text: str = QUESTION) -> str:
    content = [*({"type": "image"} for _ in images), {"type": "text", "text": text}]
    prompt = reference.prompt([{"role": "user", "content": content}])
    return reference.generate(prompt, images, MAX_TOKENS)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("model", list(ENTRIES))
def test_greedy_output_equals_transformers(
    gateway: str, reference: Reference, model: str, stream: bool
) -> None:
    image = sample_image(1)
    expected = _expected(reference, [image])
    text, usage = _chat(
        gateway, model, [_image_part(image), {"type": "text", "text": QUESTION}], stream
    )
    assert text == expected
    assert expected.strip()
    prompt = reference.prompt(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    )
    ids = reference.processor(images=[image], text=prompt, return_tensors="np")["input_ids"]
    assert usage.prompt_tokens == ids.shape[1]


def test_two_images_in_one_message(gateway: str, reference: Reference) -> None:
    first, second = sample_image(2), sample_image(3, (64, 32))
    expected = _expected(reference, [first, second], "Compare them.")
    content = [
        _image_part(first),
        _image_part(second, "low"),
        {"type": "text", "text": "Compare them."},
    ]
    text, _ = _chat(gateway, "vis", content, stream=False)
    assert text == expected
    swapped, _ = _chat(gateway, "vis", [content[1], content[0], content[2]], stream=False)
    assert swapped == _expected(reference, [second, first], "Compare them.")


def _cached(url: str, image: Any) -> int:
    answer = httpx.post(
        f"{url}/v1/chat/completions",
        json={
            "model": "vis",
            "max_tokens": 2,
            "messages": [
                {"role": "user", "content": [_image_part(image), {"type": "text", "text": "Hi"}]}
            ],
        },
        timeout=60,
    ).json()
    details = answer["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens", 0))


def test_the_same_image_reuses_the_kv_cache_and_another_does_not(gateway: str) -> None:
    assert _cached(gateway, sample_image(10)) == 0
    assert _cached(gateway, sample_image(10)) >= 16
    assert _cached(gateway, sample_image(11)) == 0


def test_openai_sdk_and_langchain_image_parts(gateway: str, reference: Reference) -> None:
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    image = sample_image(4)
    expected = _expected(reference, [image])
    llm = ChatOpenAI(
        base_url=f"{gateway}/v1",
        api_key="unused",  # type: ignore[arg-type]
        model="vis-bls",
        max_tokens=MAX_TOKENS,  # type: ignore[call-arg]
        temperature=0,
        max_retries=0,
    )
    encoded = base64.b64encode(png_bytes(image)).decode()
    message = HumanMessage(
        content=[
            {"type": "image", "source_type": "base64", "data": encoded, "mime_type": "image/png"},
            {"type": "text", "text": QUESTION},
        ]
    )
    assert llm.invoke([message]).content == expected
    streamed = "".join(str(chunk.content) for chunk in llm.stream([message]))
    assert streamed == expected


def _error(url: str, model: str, part: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = httpx.post(
        f"{url}/v1/chat/completions",
        json={
            "model": model,
            "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, part]}],
        },
        timeout=60,
    )
    error: dict[str, Any] = response.json()["error"]
    return response.status_code, error


def _url_part(url: str, **extra: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


@pytest.mark.parametrize(
    ("model", "part", "param", "words"),
    [
        ("vis", _url_part("data:image/png;base64,bm90IGFuIGltYWdl"), "content[1]", "image"),
        ("vis", _url_part("data:image/png;base64,@@@"), "content[1]", "base64"),
        ("vis", _url_part("ftp://example.com/a.png"), "content[1]", "ftp"),
        ("vis", _url_part("https://example.com/a.png"), "content[1]", "data:"),
        ("vis-small", _url_part(data_url(sample_image(5))), "content[1]", "bytes"),
        ("vis-fetch", _url_part("http://127.0.0.1:9/a.png"), "content[1]", "127.0.0.1"),
        ("vis-fetch", _url_part("http://10.1.2.3/a.png"), "content[1]", "10.1.2.3"),
        ("vis", _url_part(data_url(sample_image(5)), detail="huge"), "detail", "detail"),
        ("text-only", _url_part(data_url(sample_image(5))), "content[1]", "text-only"),
        ("vis-engine", _url_part(data_url(sample_image(5))), "content[1]", "vis-engine"),
    ],
    ids=[
        "undecodable",
        "bad-base64",
        "scheme",
        "http-not-enabled",
        "too-large",
        "ssrf-loopback",
        "ssrf-private",
        "detail",
        "text-only-model",
        "engine-entry",
    ],
)
def test_bad_images_are_400s_naming_the_part(
    gateway: str, model: str, part: dict[str, Any], param: str, words: str
) -> None:
    status, error = _error(gateway, model, part)
    assert status == 400, error
    assert error["param"].startswith("messages[0].content[1]")
    assert error["param"].endswith(param)
    assert words.lower() in error["message"].lower()


def test_models_list_marks_vision_models(gateway: str) -> None:
    cards = {card["id"]: card for card in httpx.get(f"{gateway}/v1/models").json()["data"]}
    assert cards["vis"]["input_modalities"] == ["text", "image"]
    assert cards["text-only"]["input_modalities"] == ["text"]
