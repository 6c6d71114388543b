"""Sequences being generated and the decode batch that holds them row by row."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from deploy.triton.engine.beams import BeamGroup
from deploy.triton.engine.blocks import BlockTable
from deploy.triton.engine.guided import GrammarState, grammar_masks
from deploy.triton.engine.lora import LoadedLora
from deploy.triton.engine.sampling import (
    SamplingRows,
    banned_next_tokens,
    hits_stop_word,
    token_log_probs,
)
from deploy.triton.engine.types import (
    Beams,
    EngineFinishReason,
    EngineRequest,
    OutputCallback,
    RequestBlocks,
    SequenceOutput,
    Timings,
    TokenIds,
)

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class SequenceState:
    """One output sequence of a request: its tokens so far and how it must end."""

    request: EngineRequest
    index: int
    callback: OutputCallback
    end_ids: TokenIds
    max_new_tokens: int
    begin_suppress: TokenIds = ()
    adapter: LoadedLora | None = None
    grammar: GrammarState | None = None
    history: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float = 0.0
    emitted: int = 0
    finish: EngineFinishReason | None = None
    context_logits: npt.NDArray[np.float32] | None = None
    generation_logits: list[npt.NDArray[np.float32]] = field(default_factory=list)
    scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    table: BlockTable = field(default_factory=BlockTable)
    """The sequence's KV-cache blocks: ``table.length`` tokens of ``history`` are cached."""
    blocks: RequestBlocks | None = None
    """Its request's prompt blocks, as the perf metrics report them."""
    beam: BeamGroup | None = None
    """The beam search this row is a beam of (``index`` is its beam), or None."""

    def __post_init__(self) -> None:
        if not self.history:
            self.history = list(self.request.input_ids)
        if not self.scheduled_ns:
            self.scheduled_ns = time.time_ns()

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

    def accept(
        self, token: int, log_prob: float, logits: npt.NDArray[np.float32] | None = None
    ) -> EngineFinishReason | None:
        """Take the chosen token (and the raw logits it came from, when they are returned)."""
        now = time.time_ns()
        self.first_token_ns = self.first_token_ns or now
        self.last_token_ns = now
        if token in self.end_ids or (self.grammar is not None and token in self.grammar.stops):
            self.finish = EngineFinishReason.END_ID
            return self.finish
        if self.grammar is not None and not self.grammar.accept(token):
            logger.warning(
                "request %s: the grammar rejected token %d", self.request.request_id, token
            )
        if logits is not None:
            self.generation_logits.append(logits)
        self.generated.append(token)
        self.history.append(token)
        self.log_probs.append(log_prob)
        self.cum_log_prob += log_prob
        count = len(self.generated)
        if count >= self.request.sampling.min_tokens and hits_stop_word(
            self.generated, self.request.stop_words
        ):
            self.finish = EngineFinishReason.STOP_WORDS
        elif count >= self.max_new_tokens:
            self.finish = EngineFinishReason.LENGTH
        return self.finish

    def take_output(self) -> SequenceOutput | None:
        """The output due now: new tokens when streaming, everything once finished otherwise."""
        if self.beam is not None:
            return self.beam.take_output(self)
        streaming = self.request.streaming
        if self.finish is None and (not streaming or self.emitted == len(self.generated)):
            return None
        start = self.emitted if streaming else 0
        self.emitted = len(self.generated)
        request = self.request
        log_probs = np.asarray(self.log_probs, np.float32) if request.return_log_probs else None
        generation_logits = None
        if request.return_generation_logits:
            generation_logits = _stack(self.generation_logits)
        return SequenceOutput(
            request_id=request.request_id,
            sequence_index=self.index,
            token_ids=np.asarray(self.generated[start:], dtype=np.int32),
            log_probs=log_probs,
            cum_log_prob=self.cum_log_prob,
            finish_reason=self.finish,
            new_from=start,
            context_logits=self.context_logits,
            generation_logits=generation_logits,
            timings=Timings(
                arrival_ns=request.arrival_ns or self.scheduled_ns,
                first_scheduled_ns=self.scheduled_ns,
                first_token_ns=self.first_token_ns,
                last_token_ns=self.last_token_ns,
            ),
            cached_tokens=len(self.history),
            blocks=self.blocks,
        )

    @property
    def reports(self) -> bool:
        """Whether this row answers for its sequence (a beam search answers through beam 0)."""
        return self.beam is None or self.index == 0

    def error_output(self, message: str) -> SequenceOutput:
        """A final output reporting a failure."""
        self.finish = EngineFinishReason.ERROR
        return SequenceOutput(
            request_id=self.request.request_id,
            sequence_index=self.index,
            token_ids=np.zeros(0, dtype=np.int32),
            log_probs=None,
            cum_log_prob=self.cum_log_prob,
            finish_reason=EngineFinishReason.ERROR,
            error=message,
        )


def unstarted_outputs(
    request: EngineRequest, reason: EngineFinishReason, error: str | None
) -> list[SequenceOutput]:
    """The final outputs of a request that ends before its first token: one per sequence."""
    beam = request.beam
    return [
        SequenceOutput(
            request_id=request.request_id,
            sequence_index=index,
            token_ids=np.zeros(0, dtype=np.int32),
            log_probs=np.zeros(0, dtype=np.float32) if request.return_log_probs else None,
            cum_log_prob=0.0,
            finish_reason=reason,
            error=error,
            beams=Beams.empty(beam.width) if beam is not None else None,
        )
        for index in range(request.num_return_sequences)
    ]


def _stack(rows: list[npt.NDArray[np.float32]]) -> npt.NDArray[np.float32]:
    """Per-token logits as one `[tokens, vocab]` array (`[0, 0]` before the first token)."""
    return np.stack(rows) if rows else np.zeros((0, 0), np.float32)


class DecodeBatch:
    """Sequences decoded together; row r of the sampling state is sequences[r]."""

    def __init__(self, sequences: list[SequenceState], sampling: SamplingRows) -> None:
        self.sequences = sequences
        self.sampling = sampling

    @classmethod
    def empty(cls, vocab_size: int, device: torch.device) -> DecodeBatch:
        """A batch with no sequences."""
        return cls([], SamplingRows.empty(vocab_size, device))

    def __len__(self) -> int:
        return len(self.sequences)

    def keep(self, rows: Sequence[int]) -> list[SequenceState]:
        """Keep only `rows`, in that order; returns the sequences that left."""
        if len(rows) == len(self.sequences):
            return []
        kept = set(rows)
        left = [seq for row, seq in enumerate(self.sequences) if row not in kept]
        self.sequences = [self.sequences[r] for r in rows]
        self.sampling.select(rows)
        return left

    def extend(self, other: DecodeBatch) -> None:
        """Move the sequences of `other` into this batch."""
        if not other.sequences:
            return
        self.sequences = self.sequences + other.sequences
        self.sampling.extend(other.sampling)

    def advance(
        self, logits: torch.Tensor
    ) -> tuple[list[tuple[SequenceState, SequenceOutput]], list[SequenceState]]:
        """Choose each row's next token from its logits; finished rows leave the batch.

        Returns the outputs now due, each with the sequence it belongs to, and the sequences
        that finished.
        """
        bans = [(row, token) for row, seq in enumerate(self.sequences) for token in seq.bans()]
        allowed = grammar_masks(
            [seq.grammar for seq in self.sequences], logits.shape[-1], logits.device
        )
        processed = self.sampling.process(logits, bans, allowed)
        tokens = self.sampling.pick(processed)
        if any(seq.beam is not None for seq in self.sequences):
            tokens = self._search_beams(processed, tokens)
        self.sampling.record(tokens)
        if any(seq.request.return_log_probs for seq in self.sequences):
            log_probs = token_log_probs(logits, tokens).tolist()
        else:
            log_probs = [0.0] * len(self.sequences)
        outputs: list[tuple[SequenceState, SequenceOutput]] = []
        running: list[int] = []
        for row, (seq, token) in enumerate(zip(self.sequences, tokens.tolist(), strict=True)):
            if seq.beam is not None:
                if not seq.beam.done:
                    running.append(row)
                beam_output = seq.take_output()
                if beam_output is not None:
                    outputs.append((seq, beam_output))
                continue
            raw = None
            if seq.request.return_generation_logits:
                raw = logits[row].float().cpu().numpy()
            if seq.accept(int(token), float(log_probs[row]), raw) is None:
                running.append(row)
            output = seq.take_output()
            if output is not None:
                outputs.append((seq, output))
        return outputs, self.keep(running)

    def _search_beams(self, processed: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Step every beam search in the batch: its rows take their chosen beams' tokens and
        the sampling state of the rows they continue."""
        groups: dict[int, list[int]] = {}
        for row, seq in enumerate(self.sequences):
            if seq.beam is not None:
                groups.setdefault(id(seq.beam), []).append(row)
        chosen = tokens.tolist()
        targets: list[int] = []
        sources: list[int] = []
        for rows in groups.values():
            rows.sort(key=lambda row: self.sequences[row].index)
            group = self.sequences[rows[0]].beam
            assert group is not None
            index = torch.tensor(rows, dtype=torch.long, device=processed.device)
            parents = group.step(processed[index])
            if parents is None:
                continue
            for row, parent in zip(rows, parents, strict=True):
                targets.append(row)
                sources.append(rows[parent])
                chosen[row] = self.sequences[row].generated[-1]
        self.sampling.copy_rows(targets, sources)
        return torch.tensor(chosen, dtype=torch.long, device=tokens.device)
