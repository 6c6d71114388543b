"""The gateway's error tree and its translation from backend, decoding and framework failures.

Every error a client sees is an ``APIError``, rendered as OpenAI's ``{"error": {...}}``::

    APIError                              500 server_error
    ├── InvalidRequestError               400 invalid_request_error
    │   └── OversizeError                 400 (over a bound; counted as a request)
    │       └── ContextLengthExceeded     400 context_length_exceeded
    ├── AuthenticationError               401 invalid_api_key
    ├── ModelNotFoundError                404 model_not_found
    ├── ResourceNotFoundError             404 not_found (admin resources, stored responses)
    ├── RouteNotFoundError                404 unknown_url
    ├── MethodNotAllowedError             405 method_not_allowed
    ├── ConflictError                     409 conflict
    ├── RequestTooLargeError              413 request_too_large
    ├── RateLimitError                    429 rate_limit_exceeded, Retry-After
    ├── InternalServerError               500 internal_error (no internals)
    ├── ServiceUnavailableError           503 backend_unavailable, Retry-After
    └── GatewayTimeoutError               504 timeout

    ClientDisconnected                    no answer: nobody is left to read it

The backend's errors (``adapters.contract``) map onto it in ``from_backend_error``:
``BackendUnavailable`` and ``ModelNotFound`` (the deployment lacks the model) → 503,
``BackendTimeout`` → 504, ``InvalidRequest`` → 400 naming its field, ``LoraNotCached`` (only
after the resend) and ``InferenceFailed`` → 500. None of them shows the client the deployment's
internals (Triton model names, request ids, Triton's own words): those are logged, under the
request's id.
"""

from __future__ import annotations

import logging
import re
from typing import ClassVar

import msgspec
from litestar.exceptions import HTTPException
from msgspec import Struct

from adapters.contract import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
)

logger = logging.getLogger(__name__)
_MSGSPEC_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_NAMED_FIELD = re.compile(r"(?:missing required|unknown) field `(?P<field>[^`]+)`")


class ErrorBody(Struct, frozen=True):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorEnvelope(Struct, frozen=True):
    """Body of every error response and of the in-band SSE error event."""

    error: ErrorBody


class APIError(Exception):
    """An error the client sees, rendered as OpenAI's ``{"error": {...}}`` object."""

    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers = headers or {}
        self.kind = kind or self.error_type
        """The error's ``type``: the class's, unless this instance says otherwise."""

    def envelope(self) -> ErrorEnvelope:
        """The response body."""
        return ErrorEnvelope(
            error=ErrorBody(message=self.message, type=self.kind, param=self.param, code=self.code)
        )


class InvalidRequestError(APIError):
    """The request is malformed or asks for something this deployment cannot do."""

    status_code = 400
    error_type = "invalid_request_error"


class OversizeError(InvalidRequestError):
    """The request is larger than a bound allows: its choices, prompts, stop sequences, guides,
    the model's context or the tenant's token limits. Such a refusal still counts against the
    tenant's request limit, so that it cannot be repeated for free."""


class ContextLengthExceeded(OversizeError):
    """Prompt plus requested completion do not fit the model's context window."""

    default_code = "context_length_exceeded"


class ModelNotFoundError(APIError):
    """The request names a model this gateway does not serve."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "model_not_found"


class AuthenticationError(APIError):
    """No API key, a malformed one, or one that opens nothing."""

    status_code = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class RateLimitError(APIError):
    """A tenant limit refused the request; ``Retry-After`` says when to try again.

    As OpenAI's, its ``type`` names what ran out: ``requests`` or ``tokens``.
    """

    status_code = 429
    default_code = "rate_limit_exceeded"

    error_type = "requests"


class ResourceNotFoundError(APIError):
    """An admin API resource (tenant, key) or a stored response the caller does not have."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class ConflictError(APIError):
    """The request cannot be carried out in the gateway's current configuration."""

    status_code = 409
    error_type = "invalid_request_error"
    default_code = "conflict"


class RouteNotFoundError(APIError):
    """No endpoint at this URL."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "unknown_url"


class MethodNotAllowedError(APIError):
    """The endpoint exists but not with this HTTP method."""

    status_code = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"


class RequestTooLargeError(APIError):
    """The body is larger than the configured limit."""

    status_code = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class ServiceUnavailableError(APIError):
    """Triton cannot be reached or the model is not ready; retrying later may work."""

    status_code = 503
    default_code = "backend_unavailable"


class GatewayTimeoutError(APIError):
    """The generation did not finish within the configured request timeout."""

    status_code = 504
    default_code = "timeout"


class InternalServerError(APIError):
    """Anything unexpected; the message never carries internals."""

    default_code = "internal_error"


class ClientDisconnected(Exception):
    """The client went away before the answer was ready; nobody is left to answer."""


def unknown_model(name: str) -> ModelNotFoundError:
    """The 404 for a model name this gateway does not serve."""
    return ModelNotFoundError(
        f"The model `{name}` does not exist or you do not have access to it.", param="model"
    )


def from_decode_error(exc: msgspec.DecodeError) -> InvalidRequestError:
    """A 400 for a body that is not JSON or does not match the schema, naming the field."""
    message = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return InvalidRequestError(f"We could not parse the JSON body of your request: {message}")
    match = _MSGSPEC_PATH.search(message)
    path = match.group("path").lstrip(".") if match else ""
    named = _NAMED_FIELD.search(message)
    if named:
        path = f"{path}.{named.group('field')}" if path else named.group("field")
    return InvalidRequestError(f"Invalid request body: {message}", param=path or None)


def from_backend_error(exc: BackendError, *, retry_after_s: int) -> APIError:
    """The client-facing error for a failure reported by the backend."""
    if isinstance(exc, BackendUnavailable | ModelNotFound):
        return ServiceUnavailableError(
            "The model backend is not available right now; please retry.",
            headers={"Retry-After": str(retry_after_s)},
        )
    if isinstance(exc, BackendTimeout):
        return GatewayTimeoutError("The model did not finish within the request timeout.")
    if isinstance(exc, InvalidRequest):
        # The contract's message is worded for the client; its detail stays in the log.
        return InvalidRequestError(str(exc), param=exc.param, code="invalid_value")
    return InternalServerError("The model backend failed while generating.")


def body_too_large() -> RequestTooLargeError:
    """The 413 of a body over ``limits.max_body_bytes``, however it was noticed."""
    return RequestTooLargeError("The request body is larger than this server accepts.")


def from_http_exception(exc: HTTPException, method: str, path: str) -> APIError:
    """The OpenAI-shaped twin of one of the web framework's own errors."""
    status = exc.status_code
    if status == 404:
        return RouteNotFoundError(f"Unknown request URL: {method} {path}.")
    if status == 405:
        return MethodNotAllowedError(f"Method {method} is not allowed for {path}.")
    if status == 413:
        return body_too_large()
    if 400 <= status < 500:
        return InvalidRequestError(exc.detail)
    return InternalServerError("The server had an error while processing your request.")


def to_api_error(exc: BaseException, *, retry_after_s: int = 5) -> APIError:
    """Translate any failure into the error the client sees; unexpected ones are logged."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, BackendError):
        error = from_backend_error(exc, retry_after_s=retry_after_s)
        detail = exc.detail if isinstance(exc, InvalidRequest) and exc.detail else str(exc)
        logger.warning(
            "backend failure answered with %s: %s: %s",
            error.status_code,
            type(exc).__name__,
            detail,
        )
        return error
    if isinstance(exc, msgspec.DecodeError):
        return from_decode_error(exc)
    logger.error("unexpected failure", exc_info=exc)
    return InternalServerError("The server had an error while processing your request.")
