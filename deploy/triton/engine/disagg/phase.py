"""TensorRT-LLM's request types and the ``context_phase_params`` byte string (torch-free).

The byte string is opaque to clients: a magic, a version byte, then a JSON object. A reader
refuses a version it does not know rather than guessing at its fields.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass

MAGIC = b"TPCP"
VERSION = 1


class RequestType(enum.Enum):
    """TensorRT-LLM's ``request_type`` request parameter."""

    CONTEXT_AND_GENERATION = "context_and_generation"
    CONTEXT_ONLY = "context_only"
    GENERATION_ONLY = "generation_only"

    @classmethod
    def parse(cls, value: object) -> RequestType:
        """The request type a parameter names; absent is ``context_and_generation``."""
        if value is None or value == "":
            return cls.CONTEXT_AND_GENERATION
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(kind.value for kind in cls)
            raise BadContextPhase(f"request_type must be one of {names}, got {value!r}") from None


@dataclass(frozen=True)
class KvTransfer:
    """One request's KV-cache handoff: the blocks and bytes moved and how long it took."""

    blocks: int
    bytes: int
    ms: float


class BadContextPhase(ValueError):
    """A request's disaggregation inputs cannot be honoured."""


@dataclass(frozen=True)
class ContextPhaseParams:
    """What a generation engine needs to continue a context-only request elsewhere.

    ``address`` is the context engine's KV transfer endpoint and ``handoff_id`` the request's
    name there (unguessable: whoever holds it may take the blocks). ``first_tokens`` are the
    tokens the context phase generated (TensorRT-LLM's ``firstGenTokens``), ``draft_tokens``
    its draft tokens (none: the engine does no speculative decoding). The layout fields let the
    generation engine refuse a handoff from an engine whose cache it cannot read.
    """

    address: str
    handoff_id: str
    first_tokens: tuple[int, ...]
    prompt_length: int
    tokens_per_block: int
    model_key: str
    bytes_per_token: int
    draft_tokens: tuple[int, ...] = ()

    def encode(self) -> bytes:
        """The versioned byte string a context-only response carries."""
        body = json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()
        return MAGIC + bytes([VERSION]) + body

    @classmethod
    def decode(cls, data: bytes) -> ContextPhaseParams:
        """Read a byte string of version ``VERSION``; refuse anything else, saying why."""
        if len(data) < len(MAGIC) + 1 or not data.startswith(MAGIC):
            raise BadContextPhase(
                "context_phase_params is not the output of a context_only request of this engine"
            )
        version = data[len(MAGIC)]
        if version != VERSION:
            raise BadContextPhase(
                f"context_phase_params has version {version}; this engine reads version {VERSION}"
            )
        try:
            fields = json.loads(data[len(MAGIC) + 1 :])
            return cls(
                address=str(fields["address"]),
                handoff_id=str(fields["handoff_id"]),
                first_tokens=tuple(int(t) for t in fields["first_tokens"]),
                prompt_length=int(fields["prompt_length"]),
                tokens_per_block=int(fields["tokens_per_block"]),
                model_key=str(fields["model_key"]),
                bytes_per_token=int(fields["bytes_per_token"]),
                draft_tokens=tuple(int(t) for t in fields.get("draft_tokens", ())),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise BadContextPhase(f"context_phase_params is malformed: {exc}") from exc


def refusal(
    kind: RequestType,
    *,
    has_params: bool,
    streaming: bool,
    rows: int,
    context_logits: bool,
) -> str | None:
    """Why a request of ``kind`` with these inputs cannot be served, or None.

    As TensorRT-LLM: beams and several return sequences are not split, a context-only request
    answers once (its first token), and only a generation-only request reads
    ``context_phase_params``. A generation-only request computes no prompt, so it has no
    context logits to return.
    """
    if kind is RequestType.CONTEXT_AND_GENERATION:
        if has_params:
            return "context_phase_params are read only by a generation_only request"
        return None
    if rows > 1:
        return (
            f"request_type {kind.value} serves one sequence: beam search and "
            "num_return_sequences above 1 are not supported with disaggregated serving"
        )
    if kind is RequestType.CONTEXT_ONLY:
        if has_params:
            return "context_phase_params are read only by a generation_only request"
        if streaming:
            return (
                "a context_only request answers once, with its first token: stream the "
                "generation_only request instead"
            )
        return None
    if not has_params:
        return "a generation_only request needs the context_phase_params of a context_only one"
    if context_logits:
        return "a generation_only request computes no prompt: it has no context logits"
    return None
