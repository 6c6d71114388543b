"""An iteration's forward pass: the decode step alone, or with mixed batching the decode step
with prompt chunks riding in it (``packed``), so that a prompt costs the running batch no pass of
its own, as in TensorRT-LLM's in-flight batching."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from deploy.triton.engine import packed
from deploy.triton.engine.batch import DecodeBatch
from deploy.triton.engine.blocks import BlockTable
from deploy.triton.engine.context import ContextJob, ContextPhase
from deploy.triton.engine.kvcache import KVLayout, KVPool
from deploy.triton.engine.kvstore import KVStore
from deploy.triton.engine.runner import ModelRunner
from deploy.triton.engine.types import EngineError

logger = logging.getLogger(__name__)

PromptChunks = Sequence[tuple[ContextJob, int]]
"""Prompt chunks of one iteration: each job with the tokens it prefills."""

_PROBE_BLOCK = 4
_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}
_HALF_TOLERANCE = 3e-2


class MixedBatching:
    """Runs an iteration's decode rows and prompt chunks as one packed forward pass."""

    def __init__(self, runner: ModelRunner, context: ContextPhase) -> None:
        self.runner = runner
        self.context = context
        self.store = context.store

    @classmethod
    def enable(cls, runner: ModelRunner, context: ContextPhase) -> MixedBatching | None:
        """Mixed batching for ``runner``'s model, or None (with the reason logged) where its
        attention cannot run packed: this ``transformers`` has no attention registry, or a
        packed pass over a probe does not give the logits of separate passes."""
        if not packed.register():
            logger.info("mixed batching off: this transformers has no attention registry")
            return None
        try:
            error = probe(runner, context.store.pool.layout)
        except (packed.PackedUnsupported, EngineError, RuntimeError, TypeError) as exc:
            logger.info("mixed batching off: the model's attention cannot run packed (%s)", exc)
            return None
        tolerance = _TOLERANCE.get(context.store.pool.layout.dtype, _HALF_TOLERANCE)
        if error > tolerance:
            logger.warning(
                "mixed batching off: a packed pass differs from separate ones by %.2e (over %.0e)",
                error,
                tolerance,
            )
            return None
        logger.info("mixed batching on (packed pass within %.1e of separate ones)", error)
        return cls(runner, context)

    @staticmethod
    def takes(job: ContextJob) -> bool:
        """Whether ``job``'s chunks can run packed: prompts of token ids, through no adapter,
        whose context logits nobody asked for."""
        request = job.request
        return (
            job.entry.adapter is None
            and request.prompt_table is None
            and not request.return_context_logits
        )

    @staticmethod
    def carries(batch: DecodeBatch) -> bool:
        """Whether ``batch``'s rows can run packed: none through an adapter."""
        return all(seq.adapter is None for seq in batch.sequences)

    def run(
        self, batch: DecodeBatch, chunks: PromptChunks
    ) -> tuple[torch.Tensor, list[tuple[ContextJob, torch.Tensor | None]]]:
        """One pass for a token of every row of ``batch`` and the ``chunks``: the rows' logits
        [rows, vocab], and each chunk's job with its next-token logits once its prompt is whole
        (None before)."""
        store = self.store
        tables = _reserve_rows(store, batch)
        tokens = [seq.next_input for seq in batch.sequences]
        parts = []
        keep = list(range(len(tables)))
        for job, take in chunks:
            start = self.context.reserve(job, take)
            parts.append((job.admission.table.blocks, start, take))
            tokens.extend(job.request.input_ids[start : start + take])
            if take == job.remaining:
                keep.append(len(tokens) - 1)
        plan, write, positions = packed.plan(
            store.pool, [(table.blocks, table.length) for table in tables], parts
        )
        index = torch.tensor(keep, dtype=torch.long, device=self.runner.device)
        with packed.active(plan):
            logits = self.runner.forward_packed(
                tokens, packed.PackedView(store.pool, write), positions, index
            )
        _record_rows(store, batch)
        started: list[tuple[ContextJob, torch.Tensor | None]] = []
        found = len(tables)
        for job, take in chunks:
            done = self.context.record(job, take)
            started.append((job, logits[found] if done else None))
            found += done
        return logits[: len(tables)], started


def decode_pass(runner: ModelRunner, store: KVStore, batch: DecodeBatch) -> torch.Tensor:
    """A pass of its own for a token of every row of ``batch``: their logits [rows, vocab]."""
    tables = _reserve_rows(store, batch)
    logits = runner.decode(
        [seq.next_input for seq in batch.sequences],
        store.view(tables, 1),
        [seq.adapter for seq in batch.sequences],
    )
    _record_rows(store, batch)
    return logits


def _reserve_rows(store: KVStore, batch: DecodeBatch) -> list[BlockTable]:
    """Room for one more token in every row's table; the tables."""
    tables = [seq.table for seq in batch.sequences]
    for table in tables:
        store.grow(table, 1)
    return tables


def _record_rows(store: KVStore, batch: DecodeBatch) -> None:
    """Count every row's new token as cached, and make newly full blocks findable."""
    for seq in batch.sequences:
        seq.table.length += 1
        store.commit(seq.table, seq.history, seq.request.extra_ids)


def probe(runner: ModelRunner, layout: KVLayout) -> float:
    """The largest relative difference between a packed pass (two decode rows of different
    lengths, a chunk on a cached past and a fresh chunk) and the same tokens' separate passes."""
    pool = KVPool(layout, 12, _PROBE_BLOCK, runner.device)
    vocab = runner.vocab_size

    def ids(seed: int, n: int) -> list[int]:
        return [(seed * 31 + 7 * i + 3) % vocab for i in range(n)]

    def prefill(tokens: list[int], blocks: list[int], past: int) -> torch.Tensor:
        view = pool.view([blocks], [past], len(tokens))
        return runner.prefill(tokens, view)[0]

    row_a, row_d, chunk_b, chunk_c = ids(1, 7), ids(2, 4), ids(3, 5), ids(4, 4)
    # Separate passes: every sequence whole, in blocks of its own.
    expected = [
        prefill(row_a, [6, 7], 0),
        prefill(row_d, [8], 0),
        prefill(chunk_b, [9, 10], 0),
        prefill(chunk_c, [11], 0),
    ]
    # The packed pass: rows a and d decode their last token, b adds two tokens to three cached.
    prefill(row_a[:6], [0, 1], 0)
    prefill(row_d[:3], [2], 0)
    prefill(chunk_b[:3], [3, 4], 0)
    plan, write, positions = packed.plan(
        pool, [([0, 1], 6), ([2], 3)], [([3, 4], 3, 2), ([5], 0, 4)]
    )
    tokens = [row_a[6], row_d[3], *chunk_b[3:], *chunk_c]
    keep = torch.tensor([0, 1, 3, 7], dtype=torch.long, device=runner.device)
    with packed.active(plan):
        got = runner.forward_packed(tokens, packed.PackedView(pool, write), positions, keep)
    return max(
        float((got[i] - want).norm() / want.norm().clamp(min=1e-6))
        for i, want in enumerate(expected)
    )
