"""Beam search as TensorRT-LLM's decoder does it, for one request whose beams are rows of the
decode batch.

Each step takes the processed logits of the request's ``width`` rows: every beam's log-softmax
plus its cumulative log prob gives candidates (on the first step only beam 0's, as all beams
still hold the prompt alone), ranked with ``diversity_rate`` times the beam index added. The
best ``2 * width`` are walked in rank order: an end token among the first ``width`` offers a
finished beam scored ``cum_log_prob / generated ** length_penalty`` (its end token counted),
any other token continues a beam until ``width`` are chosen. A beam that ended on a stop word
offers itself as finished on the next step, as the C++ decoder's forced end token does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from deploy.triton.engine.blocks import BlockTable
from deploy.triton.engine.sampling import hits_stop_word
from deploy.triton.engine.types import (
    Beams,
    EngineBeamSearch,
    EngineFinishReason,
    EngineRequest,
    SequenceOutput,
    Timings,
)


def normalised(cum_log_prob: float, length: int, length_penalty: float) -> float:
    """TensorRT-LLM's beam score: ``cum_log_prob / length ** length_penalty``."""
    if length_penalty == 0.0 or length <= 1:
        return cum_log_prob
    return cum_log_prob / float(pow(float(length), length_penalty))


@dataclass(frozen=True)
class BeamCandidate:
    """A possible next beam: ``parent`` extended by ``token`` (None: the parent ended on a stop
    word and offers itself as finished), with its cumulative log prob and its rank."""

    parent: int
    token: int | None
    value: float
    rank: float


@dataclass(frozen=True)
class Hypothesis:
    """A finished beam: its tokens, their log probs, its cumulative log prob and score."""

    tokens: tuple[int, ...]
    log_probs: tuple[float, ...]
    cum_log_prob: float
    score: float
    reason: EngineFinishReason


class Finished:
    """The finished beams of a request (TensorRT-LLM's candidate beam array): at most
    ``width`` while searching; a better one replaces the worst."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.items: list[Hypothesis] = []

    @property
    def full(self) -> bool:
        """Whether ``width`` beams have finished."""
        return len(self.items) >= self.width

    @property
    def worst(self) -> float:
        """The lowest score among the finished beams."""
        return min(item.score for item in self.items)

    def offer(self, hypothesis: Hypothesis) -> None:
        """Keep ``hypothesis`` in place of the worst one once full (the caller checked that it
        is no worse)."""
        if self.full:
            worst = min(range(len(self.items)), key=lambda i: self.items[i].score)
            del self.items[worst]
        self.items.append(hypothesis)

    def best(self, count: int) -> list[Hypothesis]:
        """The ``count`` best, best first."""
        return sorted(self.items, key=lambda item: -item.score)[:count]


def candidates(
    log_probs: torch.Tensor,
    cum_log_probs: Sequence[float],
    *,
    diversity_rate: float,
    count: int,
    first: bool,
    stopped: Sequence[bool],
) -> list[BeamCandidate]:
    """The ``count`` best continuations of the beams, best rank first. ``log_probs`` is
    ``[beams, vocab]``; a stopped beam offers only itself."""
    beams = 1 if first else log_probs.shape[0]
    vocab = log_probs.shape[1]
    cum = torch.tensor(list(cum_log_probs[:beams]), dtype=torch.float32)
    total = log_probs[:beams].float().cpu() + cum.unsqueeze(1)
    bonus = diversity_rate * torch.arange(beams, dtype=torch.float32).unsqueeze(1)
    rank = total + bonus
    ended = [beam for beam in range(beams) if stopped[beam]]
    if ended:
        rank[ended] = float("-inf")
    values, indices = rank.reshape(-1).topk(min(count, rank.numel()))
    found = [
        BeamCandidate(index // vocab, index % vocab, float(total.view(-1)[index]), float(value))
        for value, index in zip(values.tolist(), indices.tolist(), strict=True)
        if value != float("-inf")
    ]
    found += [
        BeamCandidate(beam, None, float(cum[beam]), float(cum[beam] + diversity_rate * beam))
        for beam in ended
    ]
    found.sort(key=lambda candidate: -candidate.rank)
    return found[:count]


def choose(
    ranked: Sequence[BeamCandidate],
    search: EngineBeamSearch,
    end_ids: Sequence[int],
    generated: int,
    finished: Finished,
    make: Callable[[BeamCandidate, float], Hypothesis],
) -> list[BeamCandidate]:
    """Walk the ranked candidates: an end among the first ``width`` joins ``finished`` (made
    by ``make`` with its score) unless ``finished`` is full of better ones; other tokens
    continue until ``width`` beams are chosen. (The C++ decoder also stops walking at a worse
    end once full with ``early_stopping`` set; a full search with ``early_stopping`` 1 is
    already over, and walking on keeps ``width`` beams otherwise.)"""
    chosen: list[BeamCandidate] = []
    for rank, candidate in enumerate(ranked):
        if candidate.token is None or candidate.token in end_ids:
            if rank >= search.width:
                continue
            score = normalised(candidate.value, generated + 1, search.length_penalty)
            if finished.full and score < finished.worst:
                continue
            finished.offer(make(candidate, score))
        else:
            chosen.append(candidate)
        if len(chosen) >= search.width:
            break
    return chosen


def is_done(
    finished: Finished, search: EngineBeamSearch, best_rank: float, generated: int, max_new: int
) -> bool:
    """Whether the search is over after a step that left ``generated`` tokens per beam: with
    ``width`` finished beams, at once (``early_stopping`` 1), or once the best candidate cannot
    beat the worst finished beam at this length (0) or at ``max_new`` tokens when the length
    penalty rewards length (above 1)."""
    if not finished.full:
        return False
    if search.early_stopping == 1:
        return True
    length = generated
    if search.early_stopping != 0 and search.length_penalty > 0.0:
        length = max_new
    return finished.worst >= normalised(best_rank, length, search.length_penalty)


class BeamRow(Protocol):
    """A row of the decode batch as the beam search reads and rewrites it."""

    index: int
    request: EngineRequest
    history: list[int]
    generated: list[int]
    log_probs: list[float]
    cum_log_prob: float
    table: BlockTable
    finish: EngineFinishReason | None
    scheduled_ns: int
    first_token_ns: int
    last_token_ns: int


class Regrouper(Protocol):
    """The KV store, as the beam search reorders its beams' block tables."""

    def regroup(self, tables: Sequence[BlockTable], parents: Sequence[int]) -> list[BlockTable]:
        """Beam ``i``'s table continues ``tables[parents[i]]``."""
        ...


class BeamGroup:
    """The beams of one request: its rows, the finished beams, and its one output stream."""

    def __init__(
        self,
        search: EngineBeamSearch,
        rows: Sequence[BeamRow],
        store: Regrouper,
        end_ids: Sequence[int],
        max_new_tokens: int,
    ) -> None:
        self.search = search
        self.rows = list(rows)
        self.store = store
        self.end_ids = tuple(end_ids)
        self.max_new_tokens = max_new_tokens
        self.finished = Finished(search.width)
        self.stopped = [False] * search.width
        self.first = True
        self.result: list[Hypothesis] | None = None
        self.reason: EngineFinishReason | None = None
        self._due = False
        self._sent_final = False

    @property
    def done(self) -> bool:
        """Whether the search is over (its rows leave the batch)."""
        return self.reason is not None

    def step(self, processed: torch.Tensor) -> list[int] | None:
        """Choose the next beams from the rows' processed logits ``[width, vocab]``. Returns
        each row's parent row (its tokens are in the rows), or None once the search is over."""
        request = self.rows[0].request
        temperature = request.sampling.temperature
        if temperature > 0.0 and temperature != 1.0:
            processed = processed / temperature
        log_probs = torch.log_softmax(processed.float(), dim=-1)
        generated = len(self.rows[0].generated)
        width = self.search.width
        ranked = candidates(
            log_probs,
            [row.cum_log_prob for row in self.rows],
            diversity_rate=self.search.diversity_rate,
            count=width * (1 + max(1, len(self.end_ids))),
            first=self.first,
            stopped=self.stopped,
        )
        self.first = False
        chosen = choose(
            ranked, self.search, self.end_ids, generated, self.finished, self._hypothesis
        )
        now = time.time_ns()
        for row in self.rows:
            row.first_token_ns = row.first_token_ns or now
            row.last_token_ns = now
        best = ranked[0].rank if ranked else float("-inf")
        if not chosen or is_done(
            self.finished, self.search, best, generated + 1, self.max_new_tokens
        ):
            self._conclude(None)
            return None
        while len(chosen) < width:
            chosen.append(chosen[0])
        parents = [candidate.parent for candidate in chosen]
        self._advance(chosen)
        if generated + 1 >= self.max_new_tokens:
            self._conclude(EngineFinishReason.LENGTH)
            return None
        self._due = request.streaming
        return parents

    def _hypothesis(self, candidate: BeamCandidate, score: float) -> Hypothesis:
        parent = self.rows[candidate.parent]
        stopped = candidate.token is None
        reason = EngineFinishReason.STOP_WORDS if stopped else EngineFinishReason.END_ID
        return Hypothesis(
            tuple(parent.generated), tuple(parent.log_probs), candidate.value, score, reason
        )

    def _advance(self, chosen: Sequence[BeamCandidate]) -> None:
        """Rewrite the rows as the chosen beams and their KV tables to match."""
        old = [
            (list(row.history), list(row.generated), list(row.log_probs), row.cum_log_prob)
            for row in self.rows
        ]
        for row, candidate in zip(self.rows, chosen, strict=True):
            history, generated, log_probs, cum = old[candidate.parent]
            token = int(candidate.token) if candidate.token is not None else 0
            row.history = [*history, token]
            row.generated = [*generated, token]
            row.log_probs = [*log_probs, candidate.value - cum]
            row.cum_log_prob = candidate.value
        tables = self.store.regroup(
            [row.table for row in self.rows], [candidate.parent for candidate in chosen]
        )
        for row, table in zip(self.rows, tables, strict=True):
            row.table = table
        min_tokens = self.rows[0].request.sampling.min_tokens
        stop_words = self.rows[0].request.stop_words
        self.stopped = [
            len(row.generated) >= min_tokens and hits_stop_word(row.generated, stop_words)
            for row in self.rows
        ]

    def _conclude(self, reason: EngineFinishReason | None) -> None:
        """End the search: the running beams join the finished ones unless the search ended on
        its own (``reason`` None), and the best ``width`` are the result."""
        if reason is not None:
            for row in self.rows:
                length = len(row.generated)
                score = normalised(row.cum_log_prob, length, self.search.length_penalty)
                self.finished.items.append(
                    Hypothesis(
                        tuple(row.generated), tuple(row.log_probs), row.cum_log_prob, score, reason
                    )
                )
        self.result = self.finished.best(self.search.width)
        best = self.result[0].reason if self.result else EngineFinishReason.END_ID
        self.reason = reason or best
        for row in self.rows:
            row.finish = self.reason
        self._due = True

    def stop(self, reason: EngineFinishReason) -> None:
        """End the search early (cancellation): the running beams are the result."""
        if not self.done:
            self._conclude(reason)

    def take_output(self, row: BeamRow) -> SequenceOutput | None:
        """The request's output due now, through its first row: the running beams while
        streaming, the result once done."""
        if row.finish is not None and not self.done:
            self.stop(row.finish)
        if row.index != 0 or not self._due or self._sent_final:
            return None
        self._due = False
        if self.result is not None:
            self._sent_final = True
            beams = _beams(
                [h.tokens for h in self.result],
                [h.log_probs for h in self.result],
                [h.cum_log_prob for h in self.result],
            )
        else:
            beams = _beams(
                [row.generated for row in self.rows],
                [row.log_probs for row in self.rows],
                [row.cum_log_prob for row in self.rows],
            )
        return self._output(row, beams)

    def _output(self, row: BeamRow, beams: Beams) -> SequenceOutput:
        request = row.request
        first = beams.token_ids[0] if beams.token_ids else np.zeros(0, np.int32)
        return SequenceOutput(
            request_id=request.request_id,
            sequence_index=0,
            token_ids=first,
            log_probs=beams.log_probs[0] if request.return_log_probs and beams.log_probs else None,
            cum_log_prob=beams.cum_log_probs[0] if beams.cum_log_probs else 0.0,
            finish_reason=self.reason if self._sent_final else None,
            timings=Timings(
                arrival_ns=request.arrival_ns or row.scheduled_ns,
                first_scheduled_ns=row.scheduled_ns,
                first_token_ns=row.first_token_ns,
                last_token_ns=row.last_token_ns,
            ),
            cached_tokens=len(request.input_ids) + first.size,
            beams=beams,
        )


def _beams(
    tokens: Sequence[Sequence[int]],
    log_probs: Sequence[Sequence[float]],
    cum_log_probs: Sequence[float],
) -> Beams:
    return Beams(
        tuple(np.asarray(list(t), dtype=np.int32) for t in tokens),
        tuple(np.asarray(list(lp), dtype=np.float32) for lp in log_probs),
        tuple(float(c) for c in cum_log_probs),
    )
