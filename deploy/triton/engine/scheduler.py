"""Continuous-batching engine: a background thread that admits, prefills, decodes and streams."""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass

import torch

from deploy.triton.engine.checks import validate_request
from deploy.triton.engine.context import ContextPhase, Submission, plan_chunks
from deploy.triton.engine.delivery import Delivery
from deploy.triton.engine.disagg.handoff import (
    Disaggregation,
    Fetched,
    Taken,
)
from deploy.triton.engine.disagg.phase import RequestType
from deploy.triton.engine.grammars import (
    GrammarCompiles,
    GrammarReady,
    GrammarWait,
    GrammarWaits,
    compile_owner,
)
from deploy.triton.engine.guided import NOT_ENABLED, GuidedDecoding
from deploy.triton.engine.inflight import InFlight
from deploy.triton.engine.kvstore import KVStore
from deploy.triton.engine.lora import LoraCache
from deploy.triton.engine.mixed import MixedBatching
from deploy.triton.engine.runner import ModelRunner
from deploy.triton.engine.types import (
    EngineConfig,
    EngineError,
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
        self.inflight = InFlight(
            runner, self.store, self.context, self.mixed, self.disagg, self._compiling,
            self.delivery, config.max_batch_size,
        )  # fmt: skip
        self._iterations = 0
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
                    self.inflight.admit()
                    chunks = plan_chunks(
                        self.inflight.jobs,
                        self.config.max_num_tokens,
                        self.store.tokens_per_block if self.config.enable_chunked_context else 0,
                    )
                    decoded = self.inflight.iterate(chunks)
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
        block = not (self.inflight.busy() or expired)
        while True:
            try:
                command = self._inbox.get(block=block, timeout=self.disagg.wait_s())
            except queue.Empty:
                return True
            block = False
            if isinstance(command, _Shutdown):
                return False
            if isinstance(command, _Stop):
                self.inflight.cancel(command.request_id)
            elif isinstance(command, GrammarWait):
                self._compiling.hold(command)
            elif isinstance(command, GrammarReady):
                self.inflight.grammar_ready(command)
            elif isinstance(command, Taken):
                self.disagg.release(command)
            elif isinstance(command, Fetched):
                self.inflight.fetched(command)
            else:
                self.inflight.waiting.append(command)

    def _record(self, context_requests: int, context_tokens: int, decoded: int) -> None:
        """Publish this iteration's statistics and a fresh snapshot for `stats`."""
        self._iterations += 1
        kv = self.store.stats()
        self._history.append(
            IterationStats(self._iterations, context_requests, context_tokens, decoded, kv)
        )
        inflight = self.inflight
        sequences = inflight.batch.sequences
        self._snapshot = EngineStats(
            running_sequences=len(sequences) + sum(j.request.rows for j in inflight.jobs),
            waiting_requests=len(inflight.waiting) + len(self._compiling),
            steps=inflight.steps,
            max_running=inflight.max_running,
            context_requests=context_requests,
            context_tokens=context_tokens,
            cached_tokens=sum(seq.table.length for seq in sequences),
            kv_cache=kv,
            kv_transfers=self.disagg.transfers,
            kv_transfer_ms=self.disagg.transfer_ms,
        )

    def _abort_all(self, failure: str | None) -> None:
        """Every request ends (the queued commands' ones too), its outputs delivered."""
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, Submission):
                self.inflight.waiting.append(command)
            elif isinstance(command, GrammarWait):
                self.inflight.waiting.append(command.entry)
        self.inflight.abort(failure)
        self.delivery.deliver()
