"""Request, sampling and result types of the torch engine."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from deploy.triton.engine.disagg.phase import ContextPhaseParams, KvTransfer, RequestType

TokenIds = tuple[int, ...]
WordList = tuple[TokenIds, ...]


GUIDED_BACKEND = "xgrammar"
"""The one guided-decoding backend, as the C++ backend names it."""
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")
# The C++ GuidedDecodingParams constructor's words.
GUIDE_REQUIRED = "The guide string must be provided unless using GuideType::kJSON."


class EngineError(ValueError):
    """A request the engine cannot serve; the message is meant for the client."""


@dataclass(frozen=True)
class GuideRequest:
    """A request's guide: one of ``GUIDE_TYPES`` and its text (none for ``json``)."""

    guide_type: str
    guide: str | None = None

    def __post_init__(self) -> None:
        if self.guide_type not in GUIDE_TYPES:
            raise EngineError(
                f"guided_decoding_guide_type must be one of {', '.join(GUIDE_TYPES)}, "
                f"got {self.guide_type!r}"
            )
        if self.guide_type != "json" and not self.guide:
            raise EngineError(GUIDE_REQUIRED)


@dataclass(frozen=True)
class GuidedConfig:
    """Where the grammar's tokenizer comes from: TensorRT-LLM's tokenizer info JSON (keys
    ``encoded_vocab``, ``tokenizer_str``, ``stop_token_ids``) or a Hugging Face tokenizer."""

    tokenizer_info_path: str | None = None
    tokenizer_dir: str | None = None
    compile_timeout_ms: int = 5000
    """How long a request waits for its grammar before it fails (queued and compiling)."""
    max_compiles: int = 2
    """Grammars compiled at once, beside the engine's steps."""
    cache_mb: int = 256
    """Compiled grammars kept by content, in MiB; the least recently used go first."""


@dataclass(frozen=True)
class LoraRequest:
    """The LoRA tensors of one request item, as they came (weights and config None if absent)."""

    task_id: int
    weights: npt.NDArray[Any] | None = None
    config: npt.NDArray[Any] | None = None


@dataclass(frozen=True)
class SamplingConfig:
    """Per-request decoding parameters with TensorRT-LLM defaults and meanings.

    `top_k` 0 and `top_p` 0 mean "not set"; with neither set TensorRT-LLM decodes greedily,
    and so does this engine. `min_tokens` defaults to 1 as in TensorRT-LLM. The decayed top-p
    never falls below TensorRT-LLM's default floor of 1e-6: the C++ backend never reads
    `runtime_top_p_min` (it looks for `runtime_top_k_min`), so neither does this engine.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 1
    seed: int = 0
    top_p_decay: float = 1.0
    """Factor applied to the sequence's top-p after each token (TensorRT-LLM's top-p decay)."""
    top_p_reset_id: int | None = None
    """Token that sets the decayed top-p back to `top_p`."""

    @property
    def decays(self) -> bool:
        """Whether top-p changes from token to token."""
        return self.top_p > 0.0 and (self.top_p_decay != 1.0 or self.top_p_reset_id is not None)

    @property
    def greedy(self) -> bool:
        """Whether the arg-max token is always taken."""
        unset = self.top_k <= 0 and self.top_p <= 0.0
        return self.temperature <= 0.0 or self.top_k == 1 or unset

    @property
    def penalised(self) -> bool:
        """Whether any repetition, presence or frequency penalty is active."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


@dataclass(frozen=True)
class EngineBeamSearch:
    """Beam search with TensorRT-LLM's parameters and defaults: ``width`` beams, scores
    ``cum_log_prob / generated ** length_penalty``, ``early_stopping`` 1 (stop once ``width``
    beams ended), 0 (stop when no running beam can beat the finished ones, judged at the
    current length) or above 1 (the same, judged at the longest length when ``length_penalty``
    is positive), and ``diversity_rate`` times the beam's index added to its candidates' rank."""

    width: int
    length_penalty: float = 0.0
    early_stopping: int = 1
    diversity_rate: float = 0.0


@dataclass(frozen=True)
class EngineRequest:
    """One prompt to complete; `end_ids` None means the model's own end-of-sequence ids."""

    request_id: str
    input_ids: TokenIds
    max_new_tokens: int
    sampling: SamplingConfig = SamplingConfig()
    end_ids: TokenIds | None = None
    stop_words: WordList = ()
    bad_words: WordList = ()
    embedding_bias: npt.NDArray[np.float32] | None = None
    streaming: bool = False
    num_return_sequences: int = 1
    return_log_probs: bool = False
    return_context_logits: bool = False
    return_generation_logits: bool = False
    arrival_ns: int = 0
    """Wall-clock arrival time (ns since the epoch), reported by ``return_perf_metrics``."""
    lora: LoraRequest | None = None
    """The item's ``LoraRequest`` (task id, and weights and config when sent), or None."""
    guide: GuideRequest | None = None
    """The grammar the output must follow (``guided_decoding_guide_type``), or None."""
    extra_ids: TokenIds | None = None
    """Per prompt token, an id that tells apart equal token ids of different content
    (``prompt_table_extra_ids``); it salts the block of its token."""
    prompt_table: npt.NDArray[Any] | None = None
    """``[rows, hidden]`` embeddings that prompt ids ``vocab_size + r`` stand for
    (``prompt_embedding_table``: image features of a multimodal prompt), or None."""
    beam: EngineBeamSearch | None = None
    """Beam search (``beam_width`` above 1): one output holding every beam."""
    cache_salt_id: int | None = None
    """TensorRT-LLM's ``cache_salt_id``: a 64-bit salt mixed into the hash of every KV block of
    the request, so only requests with the same salt share cached blocks; None is no salt."""
    request_type: RequestType = RequestType.CONTEXT_AND_GENERATION
    """TensorRT-LLM's ``request_type``: the whole request, or one phase of a disaggregated one."""
    context_phase: ContextPhaseParams | None = None
    """A generation-only request's ``context_phase_params``: where its KV cache waits."""

    @property
    def rows(self) -> int:
        """Rows of the decode batch the request takes: one per sequence or beam."""
        width = self.beam.width if self.beam is not None else 1
        return self.num_return_sequences * width


class EngineFinishReason(enum.Enum):
    """Why a sequence stopped."""

    LENGTH = "length"
    END_ID = "end_id"
    STOP_WORDS = "stop_words"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class Timings:
    """Wall-clock times (ns since the epoch) of one sequence, as TensorRT-LLM's perf metrics."""

    arrival_ns: int
    first_scheduled_ns: int
    first_token_ns: int
    last_token_ns: int


@dataclass(frozen=True)
class RequestBlocks:
    """KV-cache blocks of one request's prompt, as TensorRT-LLM's per-request perf metrics
    count them: taken from the free pool (``alloc_total``), of which held no cached content
    (``alloc_new``), and found cached under the prompt's hash chain (``reused``)."""

    alloc_total: int = 0
    alloc_new: int = 0
    reused: int = 0


@dataclass(frozen=True)
class Beams:
    """The beams of a beam-search request: while streaming the running beams in beam order,
    at the end the best ``width`` finished ones, best first (each beam's tokens, its per-token
    log probs and their sum)."""

    token_ids: tuple[npt.NDArray[np.int32], ...]
    log_probs: tuple[npt.NDArray[np.float32], ...]
    cum_log_probs: tuple[float, ...]

    @classmethod
    def empty(cls, width: int) -> Beams:
        """``width`` beams without tokens."""
        return cls(
            tuple(np.zeros(0, np.int32) for _ in range(width)),
            tuple(np.zeros(0, np.float32) for _ in range(width)),
            (0.0,) * width,
        )


@dataclass(frozen=True)
class SequenceOutput:
    """A result delivered to the caller.

    Streaming requests get one output per new token (`token_ids` holds only the new tokens,
    empty when the sequence ends on an end id or is cancelled); other requests get a single
    output holding every generated token. `log_probs` and `generation_logits` always cover
    every token generated so far and `cum_log_prob` is the running total; the response layer
    slices what the TensorRT-LLM contract wants. `context_logits` are the prompt's logits
    `[prompt_len, vocab]` when the request asked for them.
    """

    request_id: str
    sequence_index: int
    token_ids: npt.NDArray[np.int32]
    log_probs: npt.NDArray[np.float32] | None
    cum_log_prob: float
    finish_reason: EngineFinishReason | None = None
    error: str | None = None
    new_from: int = 0
    """Index of the first token of `token_ids` among all tokens generated so far."""
    context_logits: npt.NDArray[np.float32] | None = None
    generation_logits: npt.NDArray[np.float32] | None = None
    timings: Timings | None = None
    cached_tokens: int = 0
    """Prompt plus generated tokens held in the KV cache for this sequence."""
    blocks: RequestBlocks | None = None
    """The request's KV-cache blocks (None from an engine without a block store)."""
    beams: Beams | None = None
    """Every beam of a beam-search request (``token_ids`` then holds the first one's)."""
    context_phase_params: bytes | None = None
    """A context-only request's handoff, for the generation-only request that continues it."""
    kv_transfer: KvTransfer | None = None
    """A generation-only request's KV-cache handoff."""

    @property
    def finished(self) -> bool:
        """Whether this is the last output of its sequence."""
        return self.finish_reason is not None


OutputCallback = Callable[[SequenceOutput], None]


@dataclass(frozen=True)
class KvCacheConfig:
    """The paged KV cache: block size, prefix reuse and the memory budget.

    On CUDA the pool takes ``free_gpu_mem_fraction`` of the memory free once the model is
    loaded; on the CPU it holds ``max_tokens``, by default room for every running sequence at
    full length. ``max_tokens`` also caps the CUDA pool, as ``max_tokens_in_paged_kv_cache``
    caps TensorRT-LLM's.
    """

    tokens_per_block: int = 32
    enable_reuse: bool = True
    free_gpu_mem_fraction: float = 0.9
    max_tokens: int | None = None


@dataclass(frozen=True)
class EngineConfig:
    """Where the model comes from and how the engine runs it."""

    model_path: str
    device: str = "auto"
    dtype: str = "auto"
    max_batch_size: int = 16
    max_seq_len: int | None = None
    num_threads: int | None = None
    lora_cache_size: int = 8
    """LoRA adapters kept between requests; the least recently used is evicted first."""
    guided: GuidedConfig | None = None
    """Guided decoding (``guided_decoding_backend: xgrammar``) and its tokenizer, or None."""
    kv_cache: KvCacheConfig = KvCacheConfig()
    enable_chunked_context: bool = False
    """Prefill long prompts in chunks between decode steps of the running batch."""
    max_num_tokens: int = 8192
    """Most prompt tokens prefilled in one iteration (whole prompts when not chunked: at least
    one prompt per iteration)."""
    mixed_batching: bool = True
    """Prompt chunks run in the decode step's forward pass, packed with its rows (where the
    model's attention allows it), instead of in passes of their own."""
    iter_stats_max_iterations: int = 1000
    """Iteration statistics kept until read."""
    max_beam_width: int = 1
    """Widest beam search a request may ask for (``max_beam_width``)."""
    kv_transfer_timeout_ms: int = 30000
    """How long a context-only request's KV-cache blocks wait for the generation engine to take
    them before they are freed."""


@dataclass(frozen=True)
class KvCacheStats:
    """The KV-cache pool as TensorRT-LLM's ``KvCacheStats`` describes it.

    ``used`` blocks are held by running sequences; ``free`` ones are empty or hold cached
    content nothing references (evicted, least recently used first, when needed), so
    ``free + used == max``. ``alloc_total``, ``alloc_new``, ``reused`` and ``missed`` count
    since the start.
    """

    max_blocks: int
    free_blocks: int
    used_blocks: int
    tokens_per_block: int
    alloc_total: int = 0
    alloc_new: int = 0
    reused: int = 0
    missed: int = 0
    cached_blocks: int = 0
    """Free blocks that hold reusable content."""

    @property
    def fraction(self) -> float:
        """Share of the pool in use."""
        return self.used_blocks / self.max_blocks if self.max_blocks else 0.0


@dataclass(frozen=True)
class IterationStats:
    """What one scheduler iteration did: the prompt tokens it prefilled (whole prompts or
    chunks) and the sequences it decoded a token for."""

    iteration: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    kv_cache: KvCacheStats


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the scheduler's occupancy, read between iterations.

    `steps` counts decode iterations; `max_running` is the most sequences that ever shared
    one; `waiting_requests` are queued for a batch slot or for their grammar to compile;
    `context_requests` and `context_tokens` describe the last iteration's prefills;
    `cached_tokens` is what the KV cache of the running sequences holds; `kv_cache` the block
    pool (None for an engine without one).
    """

    running_sequences: int
    waiting_requests: int
    steps: int
    max_running: int = 0
    context_requests: int = 0
    context_tokens: int = 0
    cached_tokens: int = 0
    kv_cache: KvCacheStats | None = None
    kv_transfers: int = 0
    """KV-cache handoffs this engine sent or received since it started."""
    kv_transfer_ms: float = 0.0
    """Their time in all, in milliseconds."""


class ServingEngine(Protocol):
    """What the ``tensorrt_llm`` Triton model needs of an engine: the torch engine, or the paced
    load-test engine of the benchmarks."""

    max_batch_size: int
    max_seq_len: int | None
    max_beam_width: int

    @property
    def vocab_size(self) -> int:
        """Token ids at or above this are refused."""
        ...

    def submit(self, request: EngineRequest, callback: OutputCallback) -> None:
        """Queue a request; raises ``EngineError`` when it cannot be served."""
        ...

    def stop(self, request_id: str) -> None:
        """End a request early; each sequence still gets its final output."""
        ...

    def stats(self) -> EngineStats:
        """Current occupancy."""
        ...

    def memory_bytes(self) -> int:
        """Accelerator memory in use (0 on the CPU)."""
        ...

    def shutdown(self) -> None:
        """Cancel everything still running and stop."""
        ...
