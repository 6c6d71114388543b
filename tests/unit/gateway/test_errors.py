"""Every failure becomes OpenAI's error object with the right status."""

from __future__ import annotations

import msgspec
import pytest
from litestar.exceptions import HTTPException, NotFoundException

from adapters.contract import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    InferenceFailed,
    InvalidRequest,
    ModelNotFound,
)
from gateway.errors import from_http_exception, to_api_error
from gateway.openai.protocol import ChatCompletionRequest


@pytest.mark.parametrize(
    ("error", "status", "code", "param"),
    [
        (BackendUnavailable("refused"), 503, "backend_unavailable", None),
        (ModelNotFound("tiny_ensemble"), 503, "backend_unavailable", None),
        (BackendTimeout("slow"), 504, "timeout", None),
        (InvalidRequest("no top_k", param="top_k"), 400, "invalid_value", "top_k"),
        (InferenceFailed("boom at /srv/x.py line 3"), 500, "internal_error", None),
        (BackendError("other"), 500, "internal_error", None),
    ],
)
def test_backend_errors(
    error: BackendError, status: int, code: str | None, param: str | None
) -> None:
    api_error = to_api_error(error, retry_after_s=7)
    assert api_error.status_code == status
    assert api_error.code == code
    assert api_error.param == param
    if status == 503:
        assert api_error.headers == {"Retry-After": "7"}
    if status == 500:
        assert "/srv" not in api_error.message


def test_unexpected_errors_hide_internals() -> None:
    body = to_api_error(RuntimeError("secret /etc/passwd")).envelope()
    assert body.error.type == "server_error"
    assert "secret" not in body.error.message


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"{", None),
        (b'{"model": 3, "messages": []}', "model"),
        (b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}', "messages[0].role"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stop": 5}', "stop"),
    ],
)
def test_decode_errors_name_the_field(raw: bytes, param: str | None) -> None:
    with pytest.raises(msgspec.DecodeError) as caught:
        msgspec.json.decode(raw, type=ChatCompletionRequest)
    error = to_api_error(caught.value)
    assert (error.status_code, error.error_type, error.param) == (
        400,
        "invalid_request_error",
        param,
    )


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (NotFoundException(), 404, "unknown_url"),
        (HTTPException(status_code=405), 405, "method_not_allowed"),
        (HTTPException(status_code=413), 413, "request_too_large"),
        (HTTPException(status_code=400, detail="bad"), 400, None),
        (HTTPException(status_code=500), 500, "internal_error"),
    ],
)
def test_framework_errors(exc: HTTPException, status: int, code: str | None) -> None:
    error = from_http_exception(exc, "GET", "/x")
    assert (error.status_code, error.code) == (status, code)
