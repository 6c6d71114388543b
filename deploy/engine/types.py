"""Request, sampling and result types of the torch engine."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

TokenIds = tuple[int, ...]
WordList = tuple[TokenIds, ...]


class EngineError(ValueError):
    """A request the engine cannot serve; the message is meant for the client."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding parameters with TensorRT-LLM defaults and meanings.

    `top_k` 0 and `top_p` 0 mean "not set"; with neither set TensorRT-LLM decodes greedily,
    and so does this engine. `min_tokens` defaults to 1 as in TensorRT-LLM.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 1
    seed: int = 0

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
class GenerationRequest:
    """One prompt to complete; `end_ids` None means the model's own end-of-sequence ids."""

    request_id: str
    input_ids: TokenIds
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    end_ids: TokenIds | None = None
    stop_words: WordList = ()
    bad_words: WordList = ()
    embedding_bias: npt.NDArray[np.float32] | None = None
    streaming: bool = False
    num_return_sequences: int = 1
    return_log_probs: bool = False


class FinishReason(enum.Enum):
    """Why a sequence stopped."""

    LENGTH = "length"
    END_ID = "end_id"
    STOP_WORDS = "stop_words"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class SequenceOutput:
    """A result delivered to the caller.

    Streaming requests get one output per new token (`token_ids` holds only the new tokens,
    empty when the sequence ends on an end id or is cancelled); other requests get a single
    output holding every generated token. `cum_log_prob` is the running total.
    """

    request_id: str
    sequence_index: int
    token_ids: npt.NDArray[np.int32]
    log_probs: npt.NDArray[np.float32] | None
    cum_log_prob: float
    finish_reason: FinishReason | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        """Whether this is the last output of its sequence."""
        return self.finish_reason is not None


OutputCallback = Callable[[SequenceOutput], None]


@dataclass(frozen=True)
class EngineConfig:
    """Where the model comes from and how the engine runs it."""

    model_path: str
    device: str = "cpu"
    dtype: str = "auto"
    max_batch_size: int = 16
    max_seq_len: int | None = None
    num_threads: int | None = None


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the scheduler's occupancy."""

    running_sequences: int
    waiting_requests: int
    steps: int
