"""The HTTP surface without a running Triton: validation, errors, models, health and metrics."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from adapters.triton.client import TritonBackend
from gateway.app import create_app
from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings

USER = [{"role": "user", "content": "hi"}]


def closed_port() -> int:
    """A port in the project's range that nothing listens on."""
    for port in range(23990, 24000):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise RuntimeError("no closed port found")


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path) -> Iterator[TestClient[Any]]:
    settings = Settings(
        models=(
            ModelSettings(
                name="tiny",
                triton_url=f"127.0.0.1:{closed_port()}",
                triton_model="tiny_ensemble",
                tokenizer_dir=str(tiny_model_dir),
                context_length=64,
                max_n=2,
            ),
        ),
        limits=LimitSettings(max_body_bytes=4096, retry_after_s=3, request_timeout_s=10),
        tenancy=TenancySettings(auth=False),
    )
    app = create_app(settings, backend_factory=lambda routes: TritonBackend(connect_timeout_s=1))
    with TestClient(app) as test_client:
        yield test_client


def error_of(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "tiny", "messages": USER, "max_tokens": -1}, "max_tokens", None),
        ({"model": "tiny", "messages": USER, "max_tokens": "5"}, "max_tokens", None),
        ({"model": "tiny", "messages": USER, "temperature": 2.5}, "temperature", None),
        ({"model": "tiny", "messages": USER, "temperature": -0.1}, "temperature", None),
        ({"model": "tiny", "messages": USER, "top_p": 1.5}, "top_p", None),
        ({"model": "tiny", "messages": USER, "n": 3}, "n", None),
        ({"model": "tiny", "messages": USER, "n": 0}, "n", None),
        ({"model": "tiny", "messages": USER, "min_p": 0.2}, "min_p", None),
        (
            {"model": "tiny", "messages": USER, "logprobs": True, "top_logprobs": 2},
            "top_logprobs",
            None,
        ),
        (
            {"model": "tiny", "messages": USER, "max_tokens": 60},
            "max_tokens",
            "context_length_exceeded",
        ),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "word " * 80}]},
            "messages",
            "context_length_exceeded",
        ),
        ({"model": "tiny", "messages": []}, "messages", None),
        (
            {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]},
            "messages[0].role",
            None,
        ),
        ({"model": "tiny"}, "messages", None),
        ({"messages": USER}, "model", None),
        ({"model": "tiny", "messages": [{"content": "x"}]}, "messages[0].role", None),
        (
            {"model": "tiny", "messages": [{"role": "assistant", "tool_calls": [{"x": 1}]}]},
            "messages[0].tool_calls[0].id",
            None,
        ),
        (
            {
                "model": "tiny",
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}],
                    },
                ],
            },
            "messages[1].tool_calls[0].function.arguments",
            None,
        ),
    ],
)
def test_chat_rejects_invalid_parameters(
    client: TestClient[Any], body: dict[str, Any], param: str | None, code: str | None
) -> None:
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny", "prompt": "x", "logprobs": 2}, "logprobs"),
        ({"model": "tiny", "prompt": [1, "a"]}, "prompt"),
        ({"model": "tiny", "prompt": [[1], []]}, "prompt"),
        ({"model": "tiny", "prompt": [True]}, "prompt"),
        ({"model": "tiny", "prompt": [1, 10**9]}, "prompt[1]"),
        ({"model": "tiny", "prompt": [[5], [10**9]]}, "prompt[1][0]"),
        ({"model": "tiny", "prompt": "x", "seed": 2**64}, "seed"),
        ({"model": "tiny", "prompt": "x", "seed": -(2**63) - 1}, "seed"),
        ({"model": "tiny", "prompt": "x", "logit_bias": {"5": 10}}, "logit_bias"),
        ({"model": "tiny", "prompt": "x", "n": 10**12}, "n"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 10**12}, "max_tokens"),
        ({"model": "tiny", "prompt": "x", "suffix": "y"}, "suffix"),
        ({"model": "tiny", "prompt": "word " * 80}, "prompt"),
        (
            {"model": "tiny", "prompt": "x", "stream_options": {"include_usage": True}},
            "stream_options",
        ),
    ],
)
def test_completions_reject_invalid_parameters(
    client: TestClient[Any], body: dict[str, Any], param: str
) -> None:
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    assert error_of(response)["param"] == param


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"",
        b"[]",
        b'"text"',
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "x": '
        + b"[" * 1500
        + b"]" * 1500
        + b"}",
    ],
)
def test_malformed_json_is_a_400_in_openai_shape(client: TestClient[Any], raw: bytes) -> None:
    response = client.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert error_of(response)["type"] == "invalid_request_error"


def test_unknown_model_is_404(client: TestClient[Any]) -> None:
    response = client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": USER})
    assert response.status_code == 404
    assert error_of(response)["code"] == "model_not_found"
    assert client.get("/v1/models/gpt-9").status_code == 404


def test_the_completion_routes_answer_options_as_the_others_do(client: TestClient[Any]) -> None:
    for path in ("/v1/completions", "/v1/chat/completions"):
        answer = client.options(path)
        assert answer.status_code == 204
        assert answer.headers["allow"] == "OPTIONS, POST"
    assert client.options("/v1/models").status_code == 204


def test_framework_errors_keep_the_openai_shape(client: TestClient[Any]) -> None:
    for response, status in [
        (client.get("/v1/nothing"), 404),
        (client.delete("/v1/models"), 405),
        (client.get("/v1/chat/completions"), 405),
        (client.post("/v1/completions", content=b"x" * 5000), 413),
    ]:
        assert response.status_code == status
        error_of(response)


@pytest.mark.parametrize("stream", [False, True])
def test_backend_down_is_503_with_retry_after(client: TestClient[Any], stream: bool) -> None:
    body = {"model": "tiny", "messages": USER, "stream": stream, "some_new_field": {"x": 1}}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "3"
    assert error_of(response)["code"] == "backend_unavailable"


def test_readiness_is_503_while_triton_is_down(client: TestClient[Any]) -> None:
    assert client.get("/health/live").json() == {"status": "ok"}
    response = client.get("/health/ready")
    assert response.status_code == 503
    assert response.json() == {"status": "not_ready", "models": {"tiny": False}}


def test_models(client: TestClient[Any]) -> None:
    listed = client.get("/v1/models").json()
    assert listed["object"] == "list"
    (card,) = listed["data"]
    assert card["id"] == "tiny"
    assert card["object"] == "model"
    assert card["max_model_len"] == 64
    assert client.get("/v1/models/tiny").json() == card


def test_metrics_count_requests(client: TestClient[Any]) -> None:
    client.get("/v1/models")
    text = client.get("/metrics").text
    assert 'gateway_requests_total{method="GET",route="/v1/models",status="200"}' in text
    assert "gateway_request_duration_seconds_bucket" in text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("OPTIONS", "/v1/chat/completions"),
        ("OPTIONS", "/v1/completions"),
        ("GET", "/v1/models"),
        ("OPTIONS", "/v1/models"),
        ("GET", "/admin/tenants"),
    ],
)
def test_every_api_route_is_refused_while_draining(
    client: TestClient[Any], method: str, path: str
) -> None:
    lifecycle = client.app.state.runtime.lifecycle
    lifecycle.refusing = True
    try:
        body = {"model": "tiny", "messages": USER, "prompt": "hi"} if method == "POST" else None
        answer = client.request(method, path, json=body)
    finally:
        lifecycle.refusing = False
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "3"
    assert error_of(answer)["code"] == "shutting_down"


def test_a_wrong_method_is_a_405_on_every_route_while_draining(client: TestClient[Any]) -> None:
    lifecycle = client.app.state.runtime.lifecycle
    lifecycle.refusing = True
    try:
        answers = [client.delete("/v1/models"), client.get("/v1/chat/completions")]
    finally:
        lifecycle.refusing = False
    assert [answer.status_code for answer in answers] == [405, 405]
    assert [error_of(answer)["code"] for answer in answers] == ["method_not_allowed"] * 2
