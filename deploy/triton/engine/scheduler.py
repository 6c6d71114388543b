"""Continuous-batching engine: a background thread that admits, prefills, decodes and streams."""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass, replace

import torch

from deploy.triton.engine.batch import DecodeBatch, SequenceState
from deploy.triton.engine.checks import validate_request
from deploy.triton.engine.context import ContextJob, ContextPhase, Submission, plan_chunks
from deploy.triton.engine.delivery import Delivery
from deploy.triton.engine.disagg.handoff import (
    Disaggregation,
    Fetched,
    Taken,
    continuing,
    first_token_logits,
)
from deploy.triton.engine.disagg.phase import KvTransfer, RequestType
from deploy.triton.engine.grammars import (
    GrammarCompiles,
    GrammarReady,
    GrammarWait,
    GrammarWaits,
    compile_owner,
)
from deploy.triton.engine.guided import NOT_ENABLED, GuidedDecoding
from deploy.triton.engine.kvstore import KVStore
from deploy.triton.engine.lora import LoraCache
from deploy.triton.engine.mixed import MixedBatching, PromptChunks, decode_pass
from deploy.triton.engine.runner import ModelRunner
from deploy.triton.engine.types import (
    EngineConfig,
    EngineError,
    EngineFinishReason,
    EngineRequest,
    EngineStats,
    IterationStats,
    OutputCallback,
)

logger = logging.getLogger(__name__)
# Pool sizing on the CPU for a model that states no context length and a config that sets none.
_FALLBACK_SEQ_LEN = 4096


@dataclass(frozen=True)
class _Stop:
    request_id: str


class _Shutdown:
    pass


_Command = Submission | _Stop | _Shutdown | GrammarWait[Submission] | GrammarReady | Taken | Fetched


class Engine:
    """Serves generation requests with in-flight batching on one model.

    `submit` queues a request; its `callback` then receives `SequenceOutput`s from the engine
    thread, ending with a finished one for every sequence (also on `stop`, errors and
    `shutdown`). Each iteration admits waiting requests whose blocks the KV store can reserve
    (taking their cached prefix), prefills prompts (whole, or with chunked context at most
    `max_num_tokens` prompt tokens) and decodes one token for every running sequence: in one
    packed forward pass with mixed batching, else a pass per prompt and one for the batch.
    """

    def __init__(
        self, runner: ModelRunner, config: EngineConfig, guided: GuidedDecoding | None = None
    ) -> None:
        self.runner = runner
        self.guided = guided
        self.config = config
        self.loras = LoraCache(config.lora_cache_size)
        self.max_batch_size = config.max_batch_size
        self.max_beam_width = config.max_beam_width
        seq_len = config.max_seq_len or runner.max_positions
        self.store = KVStore.build(runner, config, seq_len or _FALLBACK_SEQ_LEN)
        self.max_seq_len: int | None = min(seq_len or self.store.capacity, self.store.capacity)
        self.context = ContextPhase(runner, self.store, guided)
        self.grammars = (
            None if guided is None else GrammarCompiles.of(guided.compile, config.guided)
        )
        self.mixed = MixedBatching.enable(runner, self.context) if config.mixed_batching else None
        self._inbox: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self.disagg = Disaggregation(
            self.store, config.kv_transfer_timeout_ms / 1000.0, self._inbox.put
        )
        self._compiling = GrammarWaits[Submission](self._inbox.put)
        self._lock = threading.Lock()
        self._closed = False
        self.delivery = Delivery()
        self._waiting: deque[Submission] = deque()
        self._jobs: list[ContextJob] = []
        self._batch = DecodeBatch.empty(runner.vocab_size, runner.device)
        self._steps = 0
        self._iterations = 0
        self._max_running = 0
        self._history: deque[IterationStats] = deque(maxlen=config.iter_stats_max_iterations)
        self._snapshot = EngineStats(0, 0, 0, kv_cache=self.store.stats())
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, config: EngineConfig) -> Engine:
        """Load the model and start the engine thread."""
        runner = ModelRunner.load(config)
        guided = None
        if config.guided is not None:
            guided = GuidedDecoding.load(
                config.guided, config.model_path, runner.vocab_size, runner.default_end_ids
            )
        engine = cls(runner, config, guided)
        engine.start()
        return engine

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size."""
        return int(self.runner.vocab_size)

    def memory_bytes(self) -> int:
        """CUDA memory torch holds for the model and its caches (0 on the CPU)."""
        if self.runner.device.type != "cuda":
            return 0
        return int(torch.cuda.memory_allocated(self.runner.device))

    def start(self) -> None:
        """Start the engine thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="torch-engine", daemon=True)
            self._thread.start()

    def submit(self, request: EngineRequest, callback: OutputCallback) -> None:
        """Queue a request; raises `EngineError` when it cannot be served."""
        max_new = validate_request(
            request,
            self.runner.vocab_size,
            self.max_seq_len,
            self.max_batch_size,
            self.max_beam_width,
        )
        if request.request_type is RequestType.CONTEXT_ONLY:
            max_new = 1
        blocks, _ = self.store.worst_case(request, max_new)
        if not self.store.manager.fits(blocks):
            raise EngineError(
                f"the request may need {blocks} KV-cache blocks (its prompt and "
                f"{max_new} new tokens for each of its {request.rows} sequences or beams), "
                f"which must not exceed the {self.store.manager.num_blocks} blocks of the cache"
            )
        adapter = None
        if request.lora is not None:
            adapter = self.loras.resolve(request.lora, self.runner.lora_targets)
        if request.guide is not None and self.grammars is None:
            raise EngineError(NOT_ENABLED)
        entry = Submission(request, callback, max_new, adapter)
        with self._lock:
            if self._closed:
                raise EngineError("the engine is shut down")
            self.delivery.register(request.request_id, request.num_return_sequences)
            grammar = None
            if request.guide is not None and self.grammars is not None:
                grammar = self.grammars.compile(request.guide, compile_owner(request))
            self._inbox.put(
                entry if grammar is None else GrammarWait(request.request_id, entry, grammar)
            )

    def stop(self, request_id: str) -> None:
        """End a request early; each of its sequences gets a final output with what it has."""
        self._inbox.put(_Stop(request_id))

    def shutdown(self, timeout: float = 30.0) -> None:
        """Cancel everything still running and stop the engine thread."""
        with self._lock:
            self._closed = True
            self._inbox.put(_Shutdown())
        if self._thread is not None:
            self._thread.join(timeout)
        if self.grammars is not None:
            self.grammars.shutdown()
        self.disagg.close()

    def stats(self) -> EngineStats:
        """Occupancy and the KV-cache pool as of the last iteration."""
        return self._snapshot

    def iteration_stats(self) -> list[IterationStats]:
        """The iterations since the last call (at most ``iter_stats_max_iterations``)."""
        drained = []
        while True:
            try:
                drained.append(self._history.popleft())
            except IndexError:
                return drained

    def _run(self) -> None:
        failure: str | None = None
        try:
            with torch.inference_mode():
                while self._pump():
                    self._admit()
                    chunks = plan_chunks(
                        self._jobs,
                        self.config.max_num_tokens,
                        self.store.tokens_per_block if self.config.enable_chunked_context else 0,
                    )
                    decoded = self._iterate(chunks)
                    self._record(len(chunks), sum(take for _, take in chunks), decoded)
                    self.delivery.deliver()
        except Exception as exc:
            logger.exception("engine loop failed")
            failure = f"engine failure: {exc}"
        finally:
            with self._lock:
                self._closed = True
            self._abort_all(failure)

    def _pump(self) -> bool:
        # An iteration follows freed blocks, so that the statistics show them free.
        expired = self.disagg.expire()
        block = not (self._batch or self._waiting or self._jobs or expired)
        while True:
            try:
                command = self._inbox.get(block=block, timeout=self.disagg.wait_s())
            except queue.Empty:
                return True
            block = False
            if isinstance(command, _Shutdown):
                return False
            if isinstance(command, _Stop):
                self._cancel(command.request_id)
            elif isinstance(command, GrammarWait):
                self._compiling.hold(command)
            elif isinstance(command, GrammarReady):
                self._grammar_ready(command)
            elif isinstance(command, Taken):
                self.disagg.release(command)
            elif isinstance(command, Fetched):
                self._fetched(command)
            else:
                self._waiting.append(command)

    def _grammar_ready(self, ready: GrammarReady) -> None:
        """The request joins the waiting ones with its grammar, or fails with why it has none
        (unless it was cancelled while its grammar compiled)."""
        entry = self._compiling.pop(ready.request_id)
        if entry is None:
            return
        error = ready.grammar.exception()
        if error is not None:
            self.delivery.unstarted(entry, EngineFinishReason.ERROR, str(error))
        else:
            self._waiting.append(replace(entry, grammar=ready.grammar.result()))

    def _cancel(self, request_id: str) -> None:
        self.disagg.cancel(request_id)
        compiling = self._compiling.pop(request_id)
        if compiling is not None:
            self.delivery.unstarted(compiling, EngineFinishReason.CANCELLED, None)
        for entry in [e for e in self._waiting if e.request.request_id == request_id]:
            self._waiting.remove(entry)
            self.delivery.unstarted(entry, EngineFinishReason.CANCELLED, None)
        for job in [j for j in self._jobs if j.request.request_id == request_id]:
            self._drop_job(job, EngineFinishReason.CANCELLED, None)
        keep: list[int] = []
        for row, seq in enumerate(self._batch.sequences):
            if seq.request.request_id != request_id:
                keep.append(row)
                continue
            seq.finish = EngineFinishReason.CANCELLED
            output = seq.take_output()
            if output is not None:
                self.delivery.queue(seq.callback, output)
        self._release(self._batch.keep(keep))

    def _drop_job(self, job: ContextJob, reason: EngineFinishReason, error: str | None) -> None:
        self._jobs.remove(job)
        self.store.release(job.admission.table)
        self.delivery.unstarted(job.entry, reason, error)

    def _release(self, sequences: list[SequenceState]) -> None:
        for seq in sequences:
            self.store.release(seq.table)

    def _admit(self) -> None:
        """Waiting requests in order, while batch slots and KV blocks last."""
        while self._waiting:
            entry = self._waiting[0]
            running = len(self._batch) + sum(j.request.rows for j in self._jobs)
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
            self._waiting.popleft()
            self._jobs.append(ContextJob(entry, admission))

    def _continue(self, entry: Submission) -> bool:
        """Admit a generation-only request, its blocks then fetched beside the running batch;
        False while the pool cannot hold it."""
        try:
            if not self.disagg.begin(entry):
                return False
        except Exception as exc:
            self.delivery.unstarted(entry, EngineFinishReason.ERROR, str(exc))
        self._waiting.popleft()
        return True

    def _fetched(self, fetched: Fetched) -> None:
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
        self._jobs.append(job)
        assert request.context_phase is not None
        self._start(
            job, first_token_logits(request.context_phase, self.vocab_size, self.runner.device)
        )

    def _iterate(self, chunks: PromptChunks) -> int:
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
        shared = self._batch or len(packable) > 1
        if mixed is not None and packable and shared and mixed.carries(self._batch):
            return self._step(packable)
        for job, take in packable:
            self._prefill_chunk(job, take)
        return self._step() if self._batch else 0

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
        self._jobs.remove(job)
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
        self._batch.extend(group)

    def _step(self, chunks: PromptChunks = ()) -> int:
        """A token for every running sequence; ``chunks`` ride in the same pass (mixed batching).
        Returns the sequences decoded."""
        batch = self._batch
        rows = len(batch)
        self._max_running = max(self._max_running, rows)
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
            self._steps += 1
        for seq, output in outputs:
            self.delivery.queue(seq.callback, output)
        self._release(finished)
        for job, first in started:
            if first is not None:
                self._start(job, first)
        return rows

    def _record(self, context_requests: int, context_tokens: int, decoded: int) -> None:
        """Publish this iteration's statistics and a fresh snapshot for `stats`."""
        self._iterations += 1
        kv = self.store.stats()
        self._history.append(
            IterationStats(self._iterations, context_requests, context_tokens, decoded, kv)
        )
        sequences = self._batch.sequences
        self._snapshot = EngineStats(
            running_sequences=len(sequences) + sum(j.request.rows for j in self._jobs),
            waiting_requests=len(self._waiting) + len(self._compiling),
            steps=self._steps,
            max_running=self._max_running,
            context_requests=context_requests,
            context_tokens=context_tokens,
            cached_tokens=sum(seq.table.length for seq in sequences),
            kv_cache=kv,
            kv_transfers=self.disagg.transfers,
            kv_transfer_ms=self.disagg.transfer_ms,
        )

    def _fail_batch(self, message: str) -> None:
        for seq in self._batch.sequences:
            if seq.reports:
                self.delivery.queue(seq.callback, seq.error_output(message))
        self._release(self._batch.sequences)
        self._batch = DecodeBatch.empty(self.runner.vocab_size, self.runner.device)

    def _abort_all(self, failure: str | None) -> None:
        reason = EngineFinishReason.CANCELLED if failure is None else EngineFinishReason.ERROR
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, Submission):
                self._waiting.append(command)
            elif isinstance(command, GrammarWait):
                self._waiting.append(command.entry)
        self._waiting.extend(self._compiling.drain())
        self._waiting.extend(self.disagg.abandon())
        while self._waiting:
            self.delivery.unstarted(self._waiting.popleft(), reason, failure)
        for job in list(self._jobs):
            self._drop_job(job, reason, failure)
        for seq in self._batch.sequences:
            if failure is not None:
                if seq.reports:
                    self.delivery.queue(seq.callback, seq.error_output(failure))
                continue
            seq.finish = EngineFinishReason.CANCELLED
            output = seq.take_output()
            if output is not None:
                self.delivery.queue(seq.callback, output)
        self._release(self._batch.sequences)
        self._batch = DecodeBatch.empty(self.runner.vocab_size, self.runner.device)
        self.delivery.deliver()
