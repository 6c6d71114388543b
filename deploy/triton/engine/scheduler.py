"""Continuous-batching engine: a background thread that admits, prefills, decodes and streams."""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from deploy.triton.engine.batch import DecodeBatch, SequenceState
from deploy.triton.engine.checks import validate_request
from deploy.triton.engine.guided import NOT_ENABLED, GrammarState, GuidedDecoding
from deploy.triton.engine.kvcache import BatchKVCache
from deploy.triton.engine.lora import LoadedLora, LoraCache
from deploy.triton.engine.runner import ModelRunner
from deploy.triton.engine.sampling import SamplingRows, sequence_seed, static_bias
from deploy.triton.engine.types import (
    EngineConfig,
    EngineError,
    EngineRequest,
    EngineStats,
    FinishReason,
    OutputCallback,
    SequenceOutput,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Submit:
    request: EngineRequest
    callback: OutputCallback
    max_new_tokens: int
    adapter: LoadedLora | None = None
    grammar: object | None = None
    """The request's compiled grammar (xgrammar ``CompiledGrammar``), when it is guided."""


@dataclass(frozen=True)
class _Stop:
    request_id: str


class _Shutdown:
    pass


_Command = _Submit | _Stop | _Shutdown


class Engine:
    """Serves generation requests with in-flight batching on one model.

    `submit` queues a request; its `callback` then receives `SequenceOutput`s from the engine
    thread, ending with a finished one for every sequence (also on `stop`, errors and
    `shutdown`). New requests are prefilled between decode steps and join the running batch.
    """

    def __init__(
        self,
        runner: ModelRunner,
        *,
        max_batch_size: int = 16,
        max_seq_len: int | None = None,
        lora_cache_size: int = 8,
        guided: GuidedDecoding | None = None,
    ) -> None:
        self.runner = runner
        self.guided = guided
        self.loras = LoraCache(lora_cache_size)
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len or runner.max_positions
        self._inbox: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._active: dict[str, int] = {}
        self._closed = False
        self._waiting: deque[_Submit] = deque()
        self._batch = DecodeBatch.empty(runner.vocab_size, runner.device)
        self._steps = 0
        self._max_running = 0
        self._context = (0, 0)
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
        engine = cls(
            runner,
            max_batch_size=config.max_batch_size,
            max_seq_len=config.max_seq_len,
            lora_cache_size=config.lora_cache_size,
            guided=guided,
        )
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
            request, self.runner.vocab_size, self.max_seq_len, self.max_batch_size
        )
        if max_new != request.max_new_tokens:
            logger.debug("request %s capped to %d new tokens", request.request_id, max_new)
        adapter = None
        if request.lora is not None:
            adapter = self.loras.resolve(request.lora, self.runner.lora_targets)
        grammar = None
        if request.guide is not None:
            if self.guided is None:
                raise EngineError(NOT_ENABLED)
            grammar = self.guided.compile(request.guide)
        with self._lock:
            if self._closed:
                raise EngineError("the engine is shut down")
            if request.request_id in self._active:
                raise EngineError(f"request id {request.request_id!r} is already running")
            self._active[request.request_id] = request.num_return_sequences
            self._inbox.put(_Submit(request, callback, max_new, adapter, grammar))

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

    def stats(self) -> EngineStats:
        """Current occupancy (approximate while the engine runs)."""
        batch = self._batch
        requests, tokens = self._context
        return EngineStats(
            running_sequences=len(batch),
            waiting_requests=len(self._waiting),
            steps=self._steps,
            max_running=self._max_running,
            context_requests=requests,
            context_tokens=tokens,
            cached_tokens=sum(len(seq.history) for seq in list(batch.sequences)),
        )

    def _run(self) -> None:
        failure: str | None = None
        try:
            with torch.inference_mode():
                while self._pump():
                    self._admit()
                    if self._batch:
                        self._step()
        except Exception as exc:
            logger.exception("engine loop failed")
            failure = f"engine failure: {exc}"
        finally:
            with self._lock:
                self._closed = True
            self._abort_all(failure)

    def _pump(self) -> bool:
        block = not self._batch and not self._waiting
        while True:
            try:
                command = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if isinstance(command, _Shutdown):
                return False
            if isinstance(command, _Stop):
                self._cancel(command.request_id)
            else:
                self._waiting.append(command)

    def _emit(self, callback: OutputCallback, output: SequenceOutput) -> None:
        if output.finished:
            with self._lock:
                left = self._active.get(output.request_id, 1) - 1
                if left > 0:
                    self._active[output.request_id] = left
                else:
                    self._active.pop(output.request_id, None)
        try:
            callback(output)
        except Exception:
            logger.exception("output callback of request %s failed", output.request_id)

    def _emit_unstarted(self, entry: _Submit, reason: FinishReason, error: str | None) -> None:
        for index in range(entry.request.num_return_sequences):
            output = SequenceOutput(
                request_id=entry.request.request_id,
                sequence_index=index,
                token_ids=np.zeros(0, dtype=np.int32),
                log_probs=np.zeros(0, dtype=np.float32) if entry.request.return_log_probs else None,
                cum_log_prob=0.0,
                finish_reason=reason,
                error=error,
            )
            self._emit(entry.callback, output)

    def _cancel(self, request_id: str) -> None:
        for entry in [e for e in self._waiting if e.request.request_id == request_id]:
            self._waiting.remove(entry)
            self._emit_unstarted(entry, FinishReason.CANCELLED, None)
        keep: list[int] = []
        for row, seq in enumerate(self._batch.sequences):
            if seq.request.request_id != request_id:
                keep.append(row)
                continue
            seq.finish = FinishReason.CANCELLED
            output = seq.take_output()
            if output is not None:
                self._emit(seq.callback, output)
        self._batch.keep(keep)

    def _admit(self) -> None:
        requests = tokens = 0
        while self._waiting:
            wanted = self._waiting[0].request.num_return_sequences
            if len(self._batch) + wanted > self.max_batch_size:
                break
            entry = self._waiting.popleft()
            try:
                group = self._prefill(entry)
            except Exception as exc:
                logger.exception("prefill of request %s failed", entry.request.request_id)
                self._emit_unstarted(entry, FinishReason.ERROR, f"prefill failed: {exc}")
                continue
            requests += 1
            tokens += len(entry.request.input_ids)
            self._batch.extend(group)
        if requests or self._batch:
            self._context = (requests, tokens)

    def _prefill(self, entry: _Submit) -> DecodeBatch:
        request, runner = entry.request, self.runner
        n = request.num_return_sequences
        end_ids = runner.default_end_ids if request.end_ids is None else request.end_ids
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
            )
            for index in range(n)
        ]
        logits, cache, context = runner.prefill(
            request.input_ids, all_logits=request.return_context_logits, adapter=entry.adapter
        )
        context_logits = None if context is None else context.cpu().numpy()
        for seq in sequences:
            seq.context_logits = context_logits
        bias = static_bias(
            runner.vocab_size, runner.suppress_tokens, request.bad_words, request.embedding_bias
        )
        seeds = [sequence_seed(request.sampling.seed, index) for index in range(n)]
        sampling = SamplingRows.for_request(
            request.sampling, seeds, bias, request.input_ids, runner.device
        )
        kv = BatchKVCache.from_prefill(cache, runner.device).repeat(n)
        group = DecodeBatch(sequences, kv, sampling)
        for seq, output in group.advance(logits.unsqueeze(0).expand(n, -1)):
            self._emit(seq.callback, output)
        return group

    def _grammar_state(self, entry: _Submit, end_ids: tuple[int, ...]) -> GrammarState | None:
        if entry.grammar is None or self.guided is None:
            return None
        return self.guided.matcher(entry.grammar, end_ids)

    def _step(self) -> None:
        batch = self._batch
        self._max_running = max(self._max_running, len(batch))
        try:
            logits = self.runner.decode(
                [seq.next_input for seq in batch.sequences],
                batch.kv,
                [seq.adapter for seq in batch.sequences],
            )
            outputs = batch.advance(logits)
        except Exception as exc:
            logger.exception("decode step failed; failing %d sequences", len(batch))
            self._fail_batch(f"decode failed: {exc}")
            return
        self._steps += 1
        for seq, output in outputs:
            self._emit(seq.callback, output)

    def _fail_batch(self, message: str) -> None:
        for seq in self._batch.sequences:
            self._emit(seq.callback, seq.error_output(message))
        self._batch = DecodeBatch.empty(self.runner.vocab_size, self.runner.device)

    def _abort_all(self, failure: str | None) -> None:
        reason = FinishReason.CANCELLED if failure is None else FinishReason.ERROR
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Submit):
                self._waiting.append(command)
        while self._waiting:
            self._emit_unstarted(self._waiting.popleft(), reason, failure)
        for seq in self._batch.sequences:
            if failure is not None:
                self._emit(seq.callback, seq.error_output(failure))
                continue
            seq.finish = FinishReason.CANCELLED
            output = seq.take_output()
            if output is not None:
                self._emit(seq.callback, output)
        self._batch = DecodeBatch.empty(self.runner.vocab_size, self.runner.device)
