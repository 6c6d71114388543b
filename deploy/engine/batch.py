"""Sequences being generated and the decode batch that holds them row by row."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from deploy.engine.kvcache import BatchKVCache
from deploy.engine.sampling import SamplingRows, banned_next_tokens, hits_stop_word, token_log_probs
from deploy.engine.types import (
    FinishReason,
    GenerationRequest,
    OutputCallback,
    SequenceOutput,
    TokenIds,
)

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class SequenceState:
    """One output sequence of a request: its tokens so far and how it must end."""

    request: GenerationRequest
    index: int
    callback: OutputCallback
    end_ids: TokenIds
    max_new_tokens: int
    begin_suppress: TokenIds = ()
    history: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float = 0.0
    emitted: int = 0
    finish: FinishReason | None = None

    def __post_init__(self) -> None:
        if not self.history:
            self.history = list(self.request.input_ids)

    @property
    def next_input(self) -> int:
        """The last generated token, which the next decode step feeds to the model."""
        return self.generated[-1]

    def bans(self) -> list[int]:
        """Tokens this sequence must not generate next."""
        return banned_next_tokens(
            self.history,
            len(self.generated),
            self.request.sampling.min_tokens,
            self.end_ids,
            self.request.bad_words,
            self.begin_suppress,
        )

    def accept(self, token: int, log_prob: float) -> FinishReason | None:
        """Take the chosen token; returns why the sequence ends, if it does."""
        if token in self.end_ids:
            self.finish = FinishReason.END_ID
            return self.finish
        self.generated.append(token)
        self.history.append(token)
        self.log_probs.append(log_prob)
        self.cum_log_prob += log_prob
        count = len(self.generated)
        if count >= self.request.sampling.min_tokens and hits_stop_word(
            self.generated, self.request.stop_words
        ):
            self.finish = FinishReason.STOP_WORDS
        elif count >= self.max_new_tokens:
            self.finish = FinishReason.LENGTH
        return self.finish

    def take_output(self) -> SequenceOutput | None:
        """The output due now: new tokens when streaming, everything once finished otherwise."""
        streaming = self.request.streaming
        if self.finish is None and (not streaming or self.emitted == len(self.generated)):
            return None
        start = self.emitted if streaming else 0
        self.emitted = len(self.generated)
        log_probs = None
        if self.request.return_log_probs:
            log_probs = np.asarray(self.log_probs[start:], dtype=np.float32)
        return SequenceOutput(
            request_id=self.request.request_id,
            sequence_index=self.index,
            token_ids=np.asarray(self.generated[start:], dtype=np.int32),
            log_probs=log_probs,
            cum_log_prob=self.cum_log_prob,
            finish_reason=self.finish,
        )

    def error_output(self, message: str) -> SequenceOutput:
        """A final output reporting a failure."""
        self.finish = FinishReason.ERROR
        return SequenceOutput(
            request_id=self.request.request_id,
            sequence_index=self.index,
            token_ids=np.zeros(0, dtype=np.int32),
            log_probs=None,
            cum_log_prob=self.cum_log_prob,
            finish_reason=FinishReason.ERROR,
            error=message,
        )


class DecodeBatch:
    """Sequences decoded together; row r of the KV cache and sampling state is sequences[r]."""

    def __init__(
        self, sequences: list[SequenceState], kv: BatchKVCache, sampling: SamplingRows
    ) -> None:
        self.sequences = sequences
        self.kv = kv
        self.sampling = sampling

    @classmethod
    def empty(cls, vocab_size: int, device: torch.device) -> DecodeBatch:
        """A batch with no sequences."""
        return cls([], BatchKVCache.empty(device), SamplingRows.empty(vocab_size, device))

    def __len__(self) -> int:
        return len(self.sequences)

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only `rows`, in that order."""
        if len(rows) == len(self.sequences):
            return
        self.sequences = [self.sequences[r] for r in rows]
        self.kv.select(rows)
        self.sampling.select(rows)

    def extend(self, other: DecodeBatch) -> None:
        """Move the sequences of `other` into this batch."""
        if not other.sequences:
            return
        self.sequences = self.sequences + other.sequences
        self.kv.extend(other.kv)
        self.sampling.extend(other.sampling)

    def advance(self, logits: torch.Tensor) -> list[tuple[SequenceState, SequenceOutput]]:
        """Choose each row's next token from its logits; finished rows leave the batch.

        Returns the outputs now due, each with the sequence it belongs to.
        """
        bans = [(row, token) for row, seq in enumerate(self.sequences) for token in seq.bans()]
        tokens = self.sampling.choose(logits, bans)
        self.sampling.record(tokens)
        if any(seq.request.return_log_probs for seq in self.sequences):
            log_probs = token_log_probs(logits, tokens).tolist()
        else:
            log_probs = [0.0] * len(self.sequences)
        outputs: list[tuple[SequenceState, SequenceOutput]] = []
        running: list[int] = []
        for row, (seq, token) in enumerate(zip(self.sequences, tokens.tolist(), strict=True)):
            if seq.accept(int(token), float(log_probs[row])) is None:
                running.append(row)
            output = seq.take_output()
            if output is not None:
                outputs.append((seq, output))
        self.keep(running)
        return outputs
