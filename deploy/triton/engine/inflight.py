"""The engine thread's requests in flight: those waiting for a batch slot (or for their grammar,
or for their KV blocks from a context engine), the prompts being prefilled and the decode batch.
Each iteration admits what fits, prefills and decodes; a stop, a failure or the shutdown ends
requests early. Only the engine thread touches any of it; the outputs go out through the
engine's ``Delivery``."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import replace

import torch

from deploy.triton.engine.batch import DecodeBatch, SequenceState
from deploy.triton.engine.context import ContextJob, ContextPhase, Submission
from deploy.triton.engine.delivery import Delivery
from deploy.triton.engine.disagg.handoff import (
    Disaggregation,
    Fetched,
    continuing,
    first_token_logits,
)
from deploy.triton.engine.disagg.phase import KvTransfer, RequestType
from deploy.triton.engine.grammars import GrammarReady, GrammarWaits
from deploy.triton.engine.kvstore import KVStore
from deploy.triton.engine.mixed import MixedBatching, PromptChunks, decode_pass
from deploy.triton.engine.runner import ModelRunner
from deploy.triton.engine.types import EngineFinishReason

logger = logging.getLogger(__name__)


class InFlight:
    """Waiting requests, context jobs and the decode batch of one engine, with what it counts of
    its decode steps (``steps``, ``max_running``: the most sequences one step decoded)."""

    def __init__(
        self,
        runner: ModelRunner,
        store: KVStore,
        context: ContextPhase,
        mixed: MixedBatching | None,
        disagg: Disaggregation,
        compiling: GrammarWaits[Submission],
        delivery: Delivery,
        max_batch_size: int,
    ) -> None:
        self.runner = runner
        self.store = store
        self.context = context
        self.mixed = mixed
        self.disagg = disagg
        self.compiling = compiling
        """Requests waiting for their grammar."""
        self.delivery = delivery
        self.max_batch_size = max_batch_size
        self.waiting: deque[Submission] = deque()
        self.jobs: list[ContextJob] = []
        """Admitted requests whose prompts are being prefilled."""
        self.batch = DecodeBatch.empty(runner.vocab_size, runner.device)
        self.steps = 0
        self.max_running = 0

    def busy(self) -> bool:
        """Whether anything waits or runs (the engine thread then does not block for commands)."""
        return bool(self.batch or self.waiting or self.jobs)

    def abort(self, failure: str | None) -> None:
        """End every request: cancelled at the shutdown, failed with ``failure`` after an error
        of the engine loop."""
        reason = EngineFinishReason.CANCELLED if failure is None else EngineFinishReason.ERROR
        self.waiting.extend(self.compiling.drain())
        self.waiting.extend(self.disagg.abandon())
        while self.waiting:
            self.delivery.unstarted(self.waiting.popleft(), reason, failure)
        for job in list(self.jobs):
            self._drop_job(job, reason, failure)
        for seq in self.batch.sequences:
            if failure is not None:
                if seq.reports:
                    self.delivery.queue(seq.callback, seq.error_output(failure))
                continue
            seq.finish = EngineFinishReason.CANCELLED
            output = seq.take_output()
            if output is not None:
                self.delivery.queue(seq.callback, output)
        self._release(self.batch.sequences)
        self.batch = DecodeBatch.empty(self.runner.vocab_size, self.runner.device)

    def admit(self) -> None:
        """Waiting requests in order, while batch slots and KV blocks last."""
        while self.waiting:
            entry = self.waiting[0]
            running = len(self.batch) + sum(j.request.rows for j in self.jobs)
            running += self.disagg.fetching
            if running + entry.request.rows > self.max_batch_size:
                return
            if entry.request.request_type is RequestType.GENERATION_ONLY:
                if not self._continue(entry):
                    return
                continue
            admission = self.store.admit(entry.request, entry.max_new_tokens)
            if admission is None:
                return
            self.waiting.popleft()
            self.jobs.append(ContextJob(entry, admission))

    def _continue(self, entry: Submission) -> bool:
        """Admit a generation-only request, its blocks then fetched beside the running batch;
        False while the pool cannot hold it."""
        try:
            if not self.disagg.begin(entry):
                return False
        except Exception as exc:
            self.delivery.unstarted(entry, EngineFinishReason.ERROR, str(exc))
        self.waiting.popleft()
        return True

    def fetched(self, fetched: Fetched) -> None:
        """A generation-only request's blocks arrived: it starts from the context's first
        token (or ends, where the transfer failed or it was cancelled meanwhile)."""
        done = self.disagg.complete(fetched)
        if done is None:
            return
        entry, admission, outcome = done
        if not isinstance(outcome, KvTransfer):
            self.delivery.unstarted(entry, *outcome)
            return
        request = entry.request
        callback = continuing(entry.callback, outcome, request.streaming)
        job = ContextJob(replace(entry, callback=callback), admission, alloc_total=outcome.blocks)
        self.jobs.append(job)
        assert request.context_phase is not None
        self._start(
            job,
            first_token_logits(request.context_phase, self.runner.vocab_size, self.runner.device),
        )

    def grammar_ready(self, ready: GrammarReady) -> None:
        """The request joins the waiting ones with its grammar, or fails with why it has none
        (unless it was cancelled while its grammar compiled)."""
        entry = self.compiling.pop(ready.request_id)
        if entry is None:
            return
        error = ready.grammar.exception()
        if error is not None:
            self.delivery.unstarted(entry, EngineFinishReason.ERROR, str(error))
        else:
            self.waiting.append(replace(entry, grammar=ready.grammar.result()))

    def iterate(self, chunks: PromptChunks) -> int:
        """Prefill ``chunks`` and decode a token for every running sequence: in one packed pass
        where mixed batching takes them, else a pass per chunk and one for the batch. Returns
        the sequences decoded."""
        mixed = self.mixed
        packable = []
        for job, take in chunks:
            if mixed is not None and mixed.takes(job):
                packable.append((job, take))
            else:
                self._prefill_chunk(job, take)
        shared = self.batch or len(packable) > 1
        if mixed is not None and packable and shared and mixed.carries(self.batch):
            return self._step(packable)
        for job, take in packable:
            self._prefill_chunk(job, take)
        return self._step() if self.batch else 0

    def _prefill_chunk(self, job: ContextJob, take: int) -> None:
        try:
            logits = self.context.prefill(job, take)
        except Exception as exc:
            logger.exception("prefill of request %s failed", job.request.request_id)
            self._drop_job(job, EngineFinishReason.ERROR, f"prefill failed: {exc}")
            return
        if logits is not None:
            self._start(job, logits)

    def _start(self, job: ContextJob, logits: torch.Tensor) -> None:
        """``job``'s prompt is whole: its sequences join the batch with their first token."""
        self.jobs.remove(job)
        try:
            group, outputs, finished = self.context.start(job, logits)
        except Exception as exc:
            logger.exception("start of request %s failed", job.request.request_id)
            self.store.release(job.admission.table)
            self.delivery.unstarted(job.entry, EngineFinishReason.ERROR, f"prefill failed: {exc}")
            return
        if job.request.request_type is RequestType.CONTEXT_ONLY:
            outputs, finished = self.disagg.hand_off(outputs, finished)
        for seq, output in outputs:
            self.delivery.queue(seq.callback, output)
        self._release(finished)
        self.batch.extend(group)

    def _step(self, chunks: PromptChunks = ()) -> int:
        """A token for every running sequence; ``chunks`` ride in the same pass (mixed batching).
        Returns the sequences decoded."""
        batch = self.batch
        rows = len(batch)
        self.max_running = max(self.max_running, rows)
        started: list[tuple[ContextJob, torch.Tensor | None]] = []
        try:
            if chunks:
                assert self.mixed is not None
                logits, started = self.mixed.run(batch, chunks)
            else:
                logits = decode_pass(self.runner, self.store, batch)
            outputs, finished = batch.advance(logits) if rows else ([], [])
        except Exception as exc:
            logger.exception("forward pass failed: %d sequences, %d prompts", rows, len(chunks))
            for job, _ in chunks:
                self._drop_job(job, EngineFinishReason.ERROR, f"prefill failed: {exc}")
            if rows:
                self._fail_batch(f"decode failed: {exc}")
            return 0
        if rows:
            self.steps += 1
        for seq, output in outputs:
            self.delivery.queue(seq.callback, output)
        self._release(finished)
        for job, first in started:
            if first is not None:
                self._start(job, first)
        return rows

    def cancel(self, request_id: str) -> None:
        """End a request wherever it is; each of its sequences gets a final output."""
        self.disagg.cancel(request_id)
        compiling = self.compiling.pop(request_id)
        if compiling is not None:
            self.delivery.unstarted(compiling, EngineFinishReason.CANCELLED, None)
        for entry in [e for e in self.waiting if e.request.request_id == request_id]:
            self.waiting.remove(entry)
            self.delivery.unstarted(entry, EngineFinishReason.CANCELLED, None)
        for job in [j for j in self.jobs if j.request.request_id == request_id]:
            self._drop_job(job, EngineFinishReason.CANCELLED, None)
        keep: list[int] = []
        for row, seq in enumerate(self.batch.sequences):
            if seq.request.request_id != request_id:
                keep.append(row)
                continue
            seq.finish = EngineFinishReason.CANCELLED
            output = seq.take_output()
            if output is not None:
                self.delivery.queue(seq.callback, output)
        self._release(self.batch.keep(keep))

    def _drop_job(self, job: ContextJob, reason: EngineFinishReason, error: str | None) -> None:
        self.jobs.remove(job)
        self.store.release(job.admission.table)
        self.delivery.unstarted(job.entry, reason, error)

    def _release(self, sequences: list[SequenceState]) -> None:
        for seq in sequences:
            self.store.release(seq.table)

    def _fail_batch(self, message: str) -> None:
        for seq in self.batch.sequences:
            if seq.reports:
                self.delivery.queue(seq.callback, seq.error_output(message))
        self._release(self.batch.sequences)
        self.batch = DecodeBatch.empty(self.runner.vocab_size, self.runner.device)
