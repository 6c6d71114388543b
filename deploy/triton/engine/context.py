"""The context phase of a request: its prompt prefilled into the KV store, whole or in chunks, on
top of the cached prefix it was admitted with; then its sequences, ready to join the batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from deploy.triton.engine.batch import DecodeBatch, SequenceState
from deploy.triton.engine.beams import BeamGroup
from deploy.triton.engine.blocks import BlockTable
from deploy.triton.engine.guided import GrammarState, GuidedDecoding
from deploy.triton.engine.kvstore import AdmittedBlocks, KVStore
from deploy.triton.engine.lora import LoadedLora
from deploy.triton.engine.runner import ModelRunner
from deploy.triton.engine.sampling import SamplingRows, sequence_seed, static_bias
from deploy.triton.engine.types import (
    EngineRequest,
    OutputCallback,
    RequestBlocks,
    SequenceOutput,
)


@dataclass(frozen=True)
class Submission:
    """A request as the engine thread receives it, checked and resolved."""

    request: EngineRequest
    callback: OutputCallback
    max_new_tokens: int
    adapter: LoadedLora | None = None
    grammar: object | None = None
    """The request's compiled grammar (xgrammar ``CompiledGrammar``), when it is guided."""


@dataclass(eq=False)
class ContextJob:
    """A request whose prompt is being prefilled."""

    entry: Submission
    admission: AdmittedBlocks
    alloc_total: int = 0
    alloc_new: int = 0
    context_logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def request(self) -> EngineRequest:
        """The request."""
        return self.entry.request

    @property
    def remaining(self) -> int:
        """Prompt tokens not prefilled yet."""
        return len(self.request.input_ids) - self.admission.table.length

    def chunk(self, budget: int, tokens_per_block: int) -> int:
        """Tokens of the next chunk within ``budget``: the rest of the prompt, or a piece that
        ends on a block boundary (so its blocks are full and findable) where one fits."""
        if self.remaining <= budget:
            return self.remaining
        start = self.admission.table.length
        aligned = (start + budget) // tokens_per_block * tokens_per_block - start
        return aligned if aligned > 0 else budget


def plan_chunks(
    jobs: Sequence[ContextJob], budget: int, chunk_blocks: int
) -> list[tuple[ContextJob, int]]:
    """The prompt chunks of an iteration, in order, within its ``budget`` of tokens: with
    chunked context (``chunk_blocks``, the block size, non-zero) pieces of prompts ending on
    block boundaries where they can; without, whole prompts (at least the first)."""
    chunks: list[tuple[ContextJob, int]] = []
    for job in jobs:
        if chunk_blocks:
            take = job.chunk(budget, chunk_blocks)
        else:
            take = job.remaining if not chunks or job.remaining <= budget else 0
        if take <= 0:
            break
        budget -= take
        chunks.append((job, take))
    return chunks


class ContextPhase:
    """Prefills admitted prompts and turns finished ones into decoding sequences."""

    def __init__(
        self, runner: ModelRunner, store: KVStore, guided: GuidedDecoding | None = None
    ) -> None:
        self.runner = runner
        self.store = store
        self.guided = guided

    def prefill(self, job: ContextJob, tokens: int) -> torch.Tensor | None:
        """Prefill the next ``tokens`` of the prompt in a pass of their own; returns the
        next-token logits once the whole prompt is in the cache (None before)."""
        request, table = job.request, job.admission.table
        start = self.reserve(job, tokens)
        logits, every = self.runner.prefill(
            request.input_ids[start : start + tokens],
            self.store.view([table], tokens),
            all_logits=request.return_context_logits,
            adapter=job.entry.adapter,
            prompt_table=request.prompt_table,
        )
        if every is not None:
            job.context_logits.append(every)
        return logits if self.record(job, tokens) else None

    def reserve(self, job: ContextJob, tokens: int) -> int:
        """Room for the next ``tokens`` of the prompt; returns where they start."""
        job.alloc_new += self.store.grow(job.admission.table, tokens)
        return job.admission.table.length

    def record(self, job: ContextJob, tokens: int) -> bool:
        """Count ``tokens`` more of the prompt as cached; True once it is whole."""
        table = job.admission.table
        table.length += tokens
        job.alloc_total = len(table.blocks) - job.admission.reused
        self.store.commit(table, job.request.input_ids, job.request.extra_ids)
        return job.remaining == 0

    def start(
        self, job: ContextJob, logits: torch.Tensor
    ) -> tuple[DecodeBatch, list[tuple[SequenceState, SequenceOutput]], list[SequenceState]]:
        """The request's sequences, each with its first token chosen from ``logits``: the batch
        they start in, the outputs due and the sequences that already finished."""
        entry, runner = job.entry, self.runner
        request = entry.request
        n = request.rows
        end_ids = runner.default_end_ids if request.end_ids is None else request.end_ids
        tables = self._tables(job, n)
        blocks = RequestBlocks(job.alloc_total, job.alloc_new, job.admission.reused)
        context_logits = self._context_logits(job)
        sequences = [
            SequenceState(
                request=request,
                index=index,
                callback=entry.callback,
                end_ids=end_ids,
                max_new_tokens=entry.max_new_tokens,
                begin_suppress=runner.begin_suppress_tokens,
                adapter=entry.adapter,
                grammar=self._grammar_state(entry, end_ids),
                context_logits=context_logits,
                table=table,
                blocks=blocks,
            )
            for index, table in enumerate(tables)
        ]
        if request.beam is not None:
            beams = BeamGroup(request.beam, sequences, self.store, end_ids, entry.max_new_tokens)
            for seq in sequences:
                seq.beam = beams
        bias = static_bias(
            runner.vocab_size, runner.suppress_tokens, request.bad_words, request.embedding_bias
        )
        seeds = [sequence_seed(request.sampling.seed, index) for index in range(n)]
        sampling = SamplingRows.for_request(
            request.sampling, seeds, bias, request.input_ids, runner.device
        )
        group = DecodeBatch(sequences, sampling)
        outputs, finished = group.advance(logits.unsqueeze(0).expand(n, -1))
        return group, outputs, finished

    def _tables(self, job: ContextJob, n: int) -> list[BlockTable]:
        """One block table per sequence: the prompt's, and forks sharing its full blocks."""
        table = job.admission.table
        per_sequence = job.admission.blocks_per_sequence
        forks = []
        for _ in range(n - 1):
            forks.append(self.store.fork(table, per_sequence - len(table.blocks)))
        return [table, *forks]

    def _context_logits(self, job: ContextJob) -> npt.NDArray[np.float32] | None:
        if not job.context_logits:
            return None
        logits: npt.NDArray[np.float32] = torch.cat(job.context_logits).cpu().numpy()
        return logits

    def _grammar_state(self, entry: Submission, end_ids: tuple[int, ...]) -> GrammarState | None:
        if entry.grammar is None or self.guided is None:
            return None
        return self.guided.matcher(entry.grammar, end_ids)
