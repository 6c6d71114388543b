"""Classification of Triton and TensorRT-LLM failures into the backend contract's error tree."""

from __future__ import annotations

from adapters.contract import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    BeamSearch,
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
which the request's own field then replaces (``refusal_named``)."""

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
)

_CONTEXT = (
    "The prompt plus max_tokens is longer than this model's context length; shorten the "
    "prompt or lower max_tokens.",
    "max_tokens",
)
_LORA = ("The LoRA adapter could not be applied to this model.", "model")
_UNSUPPORTED = ("A parameter of this request is not supported by this model.", None)
_BAD_GUIDE = (
    "The requested output format (response_format, or a tool's parameters) is not a schema this "
    "model can follow."
)
_LATE_GUIDE = (
    "The requested output format (response_format, or a tool's parameters) took too long to "
    "compile; send a smaller or shallower schema."
)
_BUSY_GUIDE = (
    "The requested output format (response_format, or a tool's parameters) took too long to "
    "compile: the model's grammar compiler was busy; try again shortly, or send a smaller or "
    "shallower schema."
)
_REFUSED = ("The model refused a parameter of this request; check its values.", None)

# Refusals of the request, with what the client is told and the field at fault: Triton's and the
# engine's own words name the deployment's models, tensors and request ids, so they only go to
# the log (``InvalidRequest.detail``).
_REFUSAL_RULES: tuple[tuple[str, tuple[str, str | None]], ...] = (
    ("unexpected inference input", _REFUSED),
    ("unexpected shape for input", _REFUSED),
    ("missing required input", _REFUSED),
    ("data-type is", _REFUSED),
    ("number of inputs", _REFUSED),
    ("is required", _REFUSED),
    ("must be a single value", _REFUSED),
    ("must be set for lora", _LORA),
    ("must have both lora_weights", _LORA),
    ("expected lora weights", _LORA),
    ("invalid low_rank", _LORA),
    ("not enabled for this model", _UNSUPPORTED),
    ("is only supported", _UNSUPPORTED),
    ("is not supported with", _UNSUPPORTED),
    ("exceeds maximum input length", _CONTEXT),
    ("exceeds maximum sequence length", _CONTEXT),
    ("invalid argument", _REFUSED),
    ("must not be negative", _REFUSED),
    ("must be positive", _REFUSED),
    ("must not exceed", _REFUSED),
    ("must be at least", _REFUSED),
    ("must be between", _REFUSED),
    ("no room is left for output", _CONTEXT),
    # the prompt's image tokens and its images differ
    ("image token(s) but", ("The request's images do not match its prompt.", "messages")),
)

# Refusals of a request's beam width, whichever engine words them (the torch engine's
# ``beam_width 4 is outside [1, max_beam_width 1]`` and ``beam_width 4 exceeds
# torch_max_batch_size``, TensorRT-LLM's ``Requested beam width 4 is larger than configured max
# beam width 1``): the request field is ``beam_width``.
_BEAM_WIDTH_RULES = ("max_beam_width", "max beam width", "exceeds torch_max_batch_size")
BEAM_WIDTH_REFUSED = "the number of beams is more than this model serves"

_STATUS_RULES: dict[str, type[BackendError]] = {
    "UNAVAILABLE": BackendUnavailable,
    "RESOURCE_EXHAUSTED": BackendUnavailable,
    "NOT_FOUND": ModelNotFound,
    "DEADLINE_EXCEEDED": BackendTimeout,
}
_REFUSAL_STATUSES = frozenset({"INVALID_ARGUMENT", "OUT_OF_RANGE"})


def classify(message: str, status: str | None = None) -> BackendError:
    """The contract error for a failure ``message`` and, when known, its gRPC ``status``.

    ``status`` is a gRPC status name, with or without the ``StatusCode.`` prefix.
    A status that names a transport failure wins over the message; otherwise the message
    decides, then the status, then ``InferenceFailed``. A refusal (``InvalidRequest``) says
    what the client can change; ``message`` becomes its ``detail``.
    """
    code = (status or "").removeprefix("StatusCode.").upper()
    if code in {"UNAVAILABLE", "DEADLINE_EXCEEDED"}:
        return _STATUS_RULES[code](message)
    lowered = message.lower()
    if any(needle in lowered for needle in _BEAM_WIDTH_RULES):
        return InvalidRequest(BEAM_WIDTH_REFUSED, param=BEAM_WIDTH, detail=message)
    if GUIDE in lowered:
        said = _BAD_GUIDE
        if "did not compile within" in lowered:
            said = _BUSY_GUIDE if "compile slots were busy" in lowered else _LATE_GUIDE
        return InvalidRequest(said, param=GUIDE, detail=message)
    for needle, error in _MESSAGE_RULES:
        if needle in lowered:
            return error(message)
    for needle, (said, param) in _REFUSAL_RULES:
        if needle in lowered:
            return InvalidRequest(said, param=param, detail=message)
    if code in _REFUSAL_STATUSES:
        return InvalidRequest(_REFUSED[0], detail=message)
    return _STATUS_RULES.get(code, InferenceFailed)(message)


def refusal_named(
    refusal: InvalidRequest, guide: Guide | None, beam: BeamSearch | None
) -> InvalidRequest | None:
    """An engine's refusal of the request's grammar or beam width, named by the request field
    that set it; ``None`` for any other refusal, which stands as raised.

    A grammar is named ``response_format``, or ``tools`` for a tool call's grammar (made of the
    tools' schemas, though ``tool_choice`` asked for it); a beam width ``n`` or ``best_of``, as
    the gateway names it where it knows the deployment's ``max_beam_width``."""
    if refusal.param == GUIDE and guide is not None:
        field = "tools" if guide.param == "tool_choice" else guide.param
        return InvalidRequest(str(refusal), param=field, detail=refusal.detail)
    if refusal.param == BEAM_WIDTH and beam is not None:
        return InvalidRequest(
            f"{beam.param} asks for {beam.width} beams, which the model refused: {refusal}",
            param=beam.param,
            detail=refusal.detail,
        )
    return None


class HttpError(Exception):
    """Triton answered the request with an HTTP error: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def status_name(self) -> str | None:
        """The gRPC status name of the same failure, for the error classifier."""
        return _STATUS_NAMES.get(self.status)
