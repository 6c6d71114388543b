"""Classification of Triton and TensorRT-LLM failures into the backend contract's error tree."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from adapters.contract import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    Guide,
    InferenceFailed,
    InvalidRequest,
    LoraNotCached,
    ModelNotFound,
)

_STATUS_NAMES = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 503: "UNAVAILABLE"}
"""The gRPC status names of Triton's HTTP error statuses."""

BEAM_WIDTH = "beam_width"
"""The ``param`` of a refused beam width, which the request's own field then replaces."""
GUIDE = "guided_decoding_guide"
"""The ``param`` of a refused grammar (one that does not parse, or did not compile in time),
which the request's own field then replaces (``guide_named``)."""

# In-band stream errors carry no status code, so the message decides; the first match wins.
_MESSAGE_RULES: tuple[tuple[str, type[BackendError]], ...] = (
    ("not found in cache. please send lora weights", LoraNotCached),
    ("has no available versions", BackendUnavailable),
    ("request for unknown model", ModelNotFound),
    ("is not ready", BackendUnavailable),
    ("is not healthy", BackendUnavailable),  # a Python model's stub process died
    ("failed to connect", BackendUnavailable),
    ("maximum queue size", BackendUnavailable),
    ("server is shutting down", BackendUnavailable),
    ("deadline exceeded", BackendTimeout),
    ("timeout expired", BackendTimeout),
    ("unexpected inference input", InvalidRequest),
    ("unexpected shape for input", InvalidRequest),
    ("missing required input", InvalidRequest),
    ("data-type is", InvalidRequest),
    ("number of inputs", InvalidRequest),
    ("is required", InvalidRequest),
    ("must be a single value", InvalidRequest),
    ("must be set for lora", InvalidRequest),
    ("must have both lora_weights", InvalidRequest),
    ("expected lora weights", InvalidRequest),
    ("invalid low_rank", InvalidRequest),
    ("not enabled for this model", InvalidRequest),
    ("is only supported", InvalidRequest),
    ("is not supported with", InvalidRequest),
    ("exceeds maximum input length", InvalidRequest),
    ("exceeds maximum sequence length", InvalidRequest),
    ("invalid argument", InvalidRequest),
    ("must not be negative", InvalidRequest),
    ("must be positive", InvalidRequest),
    ("must not exceed", InvalidRequest),
    ("must be at least", InvalidRequest),
    ("must be between", InvalidRequest),
    ("no room is left for output", InvalidRequest),
    ("image token(s) but", InvalidRequest),  # the prompt's image tokens and its images differ
)

# Refusals of a request's beam width, whichever engine words them (the torch engine's
# ``beam_width 4 is outside [1, max_beam_width 1]`` and ``beam_width 4 exceeds
# torch_max_batch_size``, TensorRT-LLM's ``Requested beam width 4 is larger than configured max
# beam width 1``): the request field is ``beam_width``.
_BEAM_WIDTH_RULES = ("max_beam_width", "max beam width", "exceeds torch_max_batch_size")

_STATUS_RULES: dict[str, type[BackendError]] = {
    "UNAVAILABLE": BackendUnavailable,
    "RESOURCE_EXHAUSTED": BackendUnavailable,
    "NOT_FOUND": ModelNotFound,
    "INVALID_ARGUMENT": InvalidRequest,
    "OUT_OF_RANGE": InvalidRequest,
    "DEADLINE_EXCEEDED": BackendTimeout,
}


def classify(message: str, status: str | None = None) -> BackendError:
    """The contract error for a failure ``message`` and, when known, its gRPC ``status``.

    ``status`` is a gRPC status name, with or without the ``StatusCode.`` prefix.
    A status that names a transport failure wins over the message; otherwise the message
    decides, then the status, then ``InferenceFailed``.
    """
    code = (status or "").removeprefix("StatusCode.").upper()
    if code in {"UNAVAILABLE", "DEADLINE_EXCEEDED"}:
        return _STATUS_RULES[code](message)
    lowered = message.lower()
    if any(needle in lowered for needle in _BEAM_WIDTH_RULES):
        return InvalidRequest(message, param=BEAM_WIDTH)
    if GUIDE in lowered:
        return InvalidRequest(message, param=GUIDE)
    for needle, error in _MESSAGE_RULES:
        if needle in lowered:
            return error(message)
    return _STATUS_RULES.get(code, InferenceFailed)(message)


@contextmanager
def guide_named(guide: Guide | None) -> Iterator[None]:
    """An engine's refusal of the request's grammar, named by the request field the grammar
    was made of: ``response_format``, or ``tools`` for a tool call's grammar (made of the
    tools' schemas, though ``tool_choice`` asked for it)."""
    try:
        yield
    except InvalidRequest as exc:
        if guide is None or exc.param != GUIDE:
            raise
        field = "tools" if guide.param == "tool_choice" else guide.param
        raise InvalidRequest(f"the grammar of {field} was refused: {exc}", param=field) from exc


class HttpError(Exception):
    """Triton answered the request with an HTTP error: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def status_name(self) -> str | None:
        """The gRPC status name of the same failure, for the error classifier."""
        return _STATUS_NAMES.get(self.status)
