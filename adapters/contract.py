"""The backend contract: neutral request/response types and the error tree the gateway sees.

Every failure a backend reports is one of::

    BackendError
    ├── BackendUnavailable   cannot be reached, not ready, or overloaded (retry later)
    ├── BackendTimeout       the request's deadline passed
    ├── ModelNotFound        the backend does not serve the model asked for
    ├── InvalidRequest       the request's parameters were refused (``param`` names the field)
    ├── LoraNotCached        the engine evicted the adapter: resend its weights
    └── InferenceFailed      accepted, then failed while generating

The gateway maps them to its own tree of HTTP errors (``gateway/errors.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

EntryModel = Literal["ensemble", "tensorrt_llm_bls", "tensorrt_llm"]
"""The TensorRT-LLM model a served model enters through: text in and out, or token ids."""
SeedOrigin = Literal["client", "choices", "variation"]
DisaggregationPhase = Literal["context_only", "generation_only"]
"""One phase of a disaggregated request (TensorRT-LLM's ``request_type``): the prefill and
first token on a context engine, or the rest on a generation engine that takes its KV cache."""


GuideType = Literal["json", "json_schema", "regex", "ebnf_grammar", "structural_tag"]


@dataclass(frozen=True, slots=True)
class Guide:
    """A grammar the output must follow, in TensorRT-LLM's guided-decoding terms."""

    guide_type: GuideType
    guide: str | None = None
    param: str = "response_format"
    """The request field that asked for it, named when the model cannot guide."""
    optional: bool = False
    """A hint (``tool_choice: auto``): left out, not refused, where the model cannot guide."""


@dataclass(frozen=True, slots=True)
class BeamSearch:
    """Beam search in TensorRT-LLM's terms: ``width`` beams of one request, best first.
    ``None`` leaves the engine's default (no length penalty; ``early_stopping`` 1: stop once
    ``width`` beams ended; 0: when no running beam can do better; 2: TensorRT-LLM's above 1,
    transformers' "never")."""

    width: int
    length_penalty: float | None = None
    early_stopping: int | None = None
    param: str = "n"
    """The request field that set the width, named when the model cannot search that wide."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling controls in TensorRT-LLM's terms; ``None`` means "leave the backend default"."""

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    defaulted: frozenset[str] = frozenset()
    """Fields filled in by defaults rather than by the client: left out for a model without
    the matching input."""
    guide: Guide | None = None
    """Guided decoding of the output (``response_format``, forced tool calls), or None."""
    beam: BeamSearch | None = None
    """Beam search instead of sampling: one request answering every beam."""
    seed_origin: SeedOrigin = "client"
    """Who chose ``seed``: the client (it must be honoured), the gateway to make the ``n``
    choices of one request differ (also required), or the gateway only so that unseeded
    requests vary (dropped where the model has no seed input)."""


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A LoRA adapter in TensorRT-LLM layout, loaded at start-up."""

    name: str
    task_id: int
    weights: object | None = None
    config: object | None = None


@dataclass(frozen=True, slots=True)
class ModelTarget:
    """Where a served model lives: one Triton server and one of its TensorRT-LLM entry models."""

    url: str
    triton_model: str
    kind: EntryModel
    engine_model: str | None = None
    """The ``tensorrt_llm`` model behind ``triton_model``; stop requests go there."""
    tokens_per_block: int | None = None
    """The engine's KV-cache block size where its config does not state it (the C++ backend
    keeps it in the engine): reused blocks times this are the prompt's cached tokens."""
    http_url: str | None = None
    """The same Triton's HTTP address, set where the model's transport is HTTP: streams go
    there (``generate_stream``)."""


class TextStream(Protocol):
    """Text of one generated sequence from its token ids, as they arrive."""

    def step(self, ids: Sequence[int]) -> str:
        """The text the new ids complete."""
        ...

    def flush(self) -> str:
        """Text still held back at the end of the sequence."""
        ...


class TokenText(Protocol):
    """The model's tokenizer, for an entry that takes and returns token ids (``tensorrt_llm``)."""

    end_id: int | None
    pad_id: int | None

    def word_ids(self, words: Sequence[str]) -> list[list[int]]:
        """Stop words as token ids, each encoded alone."""
        ...

    def text_stream(self) -> TextStream:
        """A fresh incremental decoder for one sequence."""
        ...


@dataclass(frozen=True, slots=True)
class PromptImage:
    """An image of a prompt, as the client sent it (PNG, JPEG or WebP bytes), already checked;
    the prompt's text marks where each goes, in order."""

    data: bytes
    media_type: str


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One prompt to complete. The prompt is already templated text."""

    request_id: str
    prompt: str
    params: SamplingParams
    stream: bool
    prompt_ids: Sequence[int] = ()
    """The prompt as token ids (what the engine gets from the ``tensorrt_llm`` entry)."""
    tokens: TokenText | None = None
    """The tokenizer, required by the ``tensorrt_llm`` entry."""
    lora: LoraAdapter | None = None
    timeout_s: float = 600.0
    priority: int = 0
    """Triton request priority; 0 leaves the model's default."""
    cache_salt: int | None = None
    """The 64-bit salt of the caller's KV-cache scope (TensorRT-LLM's ``cache_salt_id``): the
    engine reuses cached prompt blocks only between requests of the same salt. ``None`` where
    nothing needs keeping apart; a model that cannot take a salt yet reuses its cache refuses a
    request that carries one."""
    trace_headers: Mapping[str, str] = field(default_factory=dict)
    """W3C trace context (``traceparent``, ``tracestate``) for the gRPC metadata."""
    images: Sequence[PromptImage] = ()
    """The prompt's images, in the order their places appear in its text."""
    prompt_tokens: int | None = None
    """The prompt's exact length in the engine's tokens, where the caller counted it (a text
    prompt, tokenized as the deployment's preprocessing tokenizes it): the backend then does not
    ask the engine to count it again in every response. ``None`` (or a prompt with images, whose
    length only the engine knows) leaves the count to the engine."""
    phase: DisaggregationPhase | None = None
    """The phase this request runs, or ``None`` for the whole request (context and generation
    on one engine). Only the ``tensorrt_llm`` entry takes a phase."""
    context_phase_params: bytes | None = None
    """What a ``context_only`` answer handed over (``TokenChunk.context_phase_params``): the
    input of the ``generation_only`` request that continues it, and of no other."""


@dataclass(frozen=True, slots=True)
class Beam:
    """One beam of a beam search: its text, and where the entry returns the beam's token ids
    (``tensorrt_llm``), its exact token count and per-token log probs."""

    text: str
    token_count: int | None = None
    logprobs: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """A piece of generated output: new text and how many tokens produced it.

    ``token_count`` and ``prompt_tokens`` are ``None`` when the deployment does not report token
    counts (releases before ``return_num_*``); the gateway then counts with its own tokenizer.
    ``prompt_tokens`` is also ``None`` where the request gave its own count (``prompt_tokens``,
    not for a prompt with images), which the engine is then not asked to repeat; through the
    ``tensorrt_llm`` entry it is always the length of the ids sent.
    Streaming chunks carry their own count; a non-streaming request yields one chunk with the total.
    ``cached_tokens`` is how much of the prompt the engine found in its KV cache, where it
    reports that (``kv_cache_reused_blocks``); ``None`` where it does not.
    """

    text: str
    token_count: int | None
    prompt_tokens: int | None = None
    logprobs: tuple[float, ...] = field(default=())
    final: bool = False
    cached_tokens: int | None = None
    beams: tuple[Beam, ...] = ()
    """A beam search's beams, best first (``text`` is the first's), in one final chunk."""
    context_phase_params: bytes | None = None
    """The handoff of a ``context_only`` request, in its final chunk: opaque bytes for the
    ``generation_only`` request that continues it on another engine."""


class PreparedRequest(Protocol):
    """A request encoded for its server (everything that needs no answer from it), not sent.

    Nothing of it reaches the server until ``send`` or ``stream``; whoever decides that a request
    may go (its tenant's admission) does so in between. A prepared request that is not to be
    read (refused, or its caller gone) is ``discard``ed.
    """

    def send(self) -> None:
        """Put the request on its way now, its output left for ``stream``; optional (``stream``
        sends what was not sent)."""
        ...

    def stream(self) -> AsyncIterator[TokenChunk]:
        """The request's chunks; closing the iteration, or cancelling it, stops the request."""
        ...

    def discard(self) -> None:
        """Give the request up without reading it: one already sent is stopped at its server."""
        ...


@runtime_checkable
class Backend(Protocol):
    """A text-generation backend: prepares a request for a target, then streams it."""

    async def prepare(self, target: ModelTarget, request: GenerationRequest) -> PreparedRequest:
        """Encode ``request`` for ``target`` (reading what the target takes, once): nothing is
        sent. A request the target cannot take is refused here (``InvalidRequest``...)."""
        ...

    async def is_ready(self, target: ModelTarget) -> bool:
        """Whether the target model is loaded and ready to serve."""
        ...

    def release_handoff(self, target: ModelTarget, handoff: bytes) -> None:
        """Free at once, in the background, the KV cache that ``target``'s engine holds for
        the generation phase of the context phase that answered ``handoff`` (its
        ``context_phase_params``), a generation phase that will not come; ``close`` awaits
        it."""
        ...

    async def close(self) -> None:
        """Release channels and background tasks."""
        ...


class BackendError(Exception):
    """Base of every failure the backend reports to the gateway."""


class BackendUnavailable(BackendError):
    """The backend cannot be reached or is not ready; retrying later may work."""


class BackendTimeout(BackendError):
    """The backend did not finish within the request's deadline."""


class ModelNotFound(BackendError):
    """The backend does not serve the model that was asked for."""


class InvalidRequest(BackendError):
    """The backend rejected the request's parameters.

    Its message is what the client is told: what to change, in the API's terms, never the
    deployment's internals (Triton model names, request ids, Triton's own error text); those go
    in ``detail``, which only the log shows.
    """

    def __init__(self, message: str, *, param: str | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.param = param
        """The request field at fault (e.g. ``top_k``), when one is known."""
        self.detail = detail
        """What the deployment said or lacks, for the operator's log."""


class LoraNotCached(BackendError):
    """The engine evicted or never saw the LoRA task; resend its weights."""


class InferenceFailed(BackendError):
    """The backend accepted the request but failed while generating."""
