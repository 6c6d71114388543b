"""The paced load-test engine: made-up tokens on a TensorRT-LLM engine's schedule, no model.

Each sequence gets its first token after ``prompt_token_s`` per prompt token (the prefill) and
then one token every ``token_s``, independently of the others up to ``max_batch_size``
sequences at once (more wait, as an engine's queue does). With both times zero it answers at
once: the zero-compute engine, which measures the serving overhead alone. The tokens are
``token_id`` or the prompt's own ids in a cycle (never ``end_id`` or ``pad_id``), so a request
always gets exactly its output budget and its text, once detokenized, is made of real words.
Runs behind the same Triton model as the torch engine, so stop requests, cancellation, the
response tensors (perf metrics too, with its own times and no KV blocks) and the engine metrics
behave as there; only numpy is used.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from deploy.triton.engine.checks import validate_request
from deploy.triton.engine.disagg.phase import RequestType
from deploy.triton.engine.types import (
    EngineError,
    EngineFinishReason,
    EngineRequest,
    EngineStats,
    OutputCallback,
    SequenceOutput,
    Timings,
)

logger = logging.getLogger(__name__)

NO_LOGITS = (
    "the load-test model computes no logits (return_context_logits, return_generation_logits)"
)
NO_DISAGGREGATION = (
    "the load-test model computes no KV cache to hand over: request_type context_only and "
    "generation_only are served by the torch engine"
)
VOCAB_SIZE = 2**31 - 1
"""No model, no vocabulary: every non-negative id is accepted."""


@dataclass(frozen=True)
class PacedConfig:
    """How fast the paced engine answers."""

    token_s: float = 0.0
    """Time between two output tokens of one sequence (0.0125: 80 tokens/s per stream)."""
    prompt_token_s: float = 0.0
    """Time per prompt token before the first output token (the prefill)."""
    token_id: int | None = None
    """Every output token's id; by default the prompt's ids in a cycle."""
    max_batch_size: int = 4096
    """Sequences paced at once; more wait for a place."""
    senders: int = 4
    """Threads sending the responses (``deploy.sidecar.spec.LoadTestEngine.senders``)."""


def fake_tokens(
    prompt: npt.ArrayLike,
    count: int,
    *,
    token_id: int | None = None,
    end_id: int | None = None,
    pad_id: int | None = None,
) -> npt.NDArray[np.int32]:
    """``count`` made-up token ids: ``token_id`` throughout, or else the prompt's ids in a cycle
    (``end_id`` and ``pad_id`` left out; the first id that is neither if nothing is left)."""
    if token_id is not None and token_id != end_id:
        return np.full(count, token_id, np.int32)
    pool = np.asarray(prompt, np.int32).reshape(-1)
    banned = [t for t in (end_id, pad_id) if t is not None]
    if banned:
        pool = pool[~np.isin(pool, banned)]
    if pool.size == 0:
        pool = np.array([next(t for t in range(3) if t not in banned)], np.int32)
    return np.resize(pool, count)


@dataclass(eq=False)
class _Sequence:
    request: EngineRequest
    index: int
    tokens: npt.NDArray[np.int32]
    callback: OutputCallback
    generated: int = 0
    """Tokens made so far."""
    sent: int = 0
    """Tokens already in an output (streaming)."""
    stopped: bool = False
    scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0

    def advance(self, tokens: int) -> None:
        """``tokens`` more made now (wall-clock times for the perf metrics)."""
        now = time.time_ns()
        self.generated = tokens
        self.first_token_ns = self.first_token_ns or now
        self.last_token_ns = now

    def output(self, finish: EngineFinishReason | None) -> SequenceOutput:
        """The next output: the new tokens when streaming (none once cancelled), else all."""
        streaming = self.request.streaming
        start = self.sent if streaming else 0
        upto = self.sent if streaming and finish is EngineFinishReason.CANCELLED else self.generated
        log_probs = np.zeros(upto, np.float32) if self.request.return_log_probs else None
        self.sent = upto
        return SequenceOutput(
            request_id=self.request.request_id,
            sequence_index=self.index,
            token_ids=self.tokens[start:upto],
            log_probs=log_probs,
            cum_log_prob=0.0,
            finish_reason=finish,
            new_from=start,
            timings=Timings(
                arrival_ns=self.request.arrival_ns or self.scheduled_ns,
                first_scheduled_ns=self.scheduled_ns,
                first_token_ns=self.first_token_ns,
                last_token_ns=self.last_token_ns,
            ),
            cached_tokens=len(self.request.input_ids) + upto,
        )


@dataclass(order=True)
class _Due:
    at: float
    order: int
    sequence: _Sequence = field(compare=False)


Ready = tuple[OutputCallback, SequenceOutput]


class PacedEngine:
    """Answers ``EngineRequest``s with made-up tokens, each sequence on its own schedule."""

    def __init__(self, config: PacedConfig) -> None:
        self.config = config
        self.max_batch_size = config.max_batch_size
        self.max_seq_len: int | None = None
        self.max_beam_width = 1
        self._lock = threading.Condition()
        self._due: list[_Due] = []
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[str, list[_Sequence]] = {}
        self._order = itertools.count()
        self._emitted = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="paced-engine", daemon=True)
        self._thread.start()

    @property
    def vocab_size(self) -> int:
        """No vocabulary: any id below 2**31."""
        return VOCAB_SIZE

    def submit(self, request: EngineRequest, callback: OutputCallback) -> None:
        """Queue a request; its tokens follow on the engine's thread."""
        if request.return_context_logits or request.return_generation_logits:
            raise EngineError(NO_LOGITS)
        if request.request_type is not RequestType.CONTEXT_AND_GENERATION:
            raise EngineError(NO_DISAGGREGATION)
        budget = validate_request(request, VOCAB_SIZE, None, self.max_batch_size)
        end_id = request.end_ids[0] if request.end_ids else None
        tokens = fake_tokens(
            request.input_ids, budget, token_id=self.config.token_id, end_id=end_id
        )
        sequences = [
            _Sequence(request, index, tokens, callback)
            for index in range(request.num_return_sequences)
        ]
        with self._lock:
            if self._closed:
                raise EngineError("the engine is shut down")
            if request.request_id in self._running:
                raise EngineError(f"request id {request.request_id!r} is already running")
            self._running[request.request_id] = sequences
            self._waiting.extend(sequences)
            self._admit(time.monotonic())
            self._lock.notify()

    def stop(self, request_id: str) -> None:
        """End a request: each sequence's final output carries what it has."""
        with self._lock:
            for sequence in self._running.get(request_id, ()):
                sequence.stopped = True
            self._lock.notify()

    def stats(self) -> EngineStats:
        """Sequences running and waiting, and outputs emitted (as iterations)."""
        with self._lock:
            cached = sum(
                len(d.sequence.request.input_ids) + d.sequence.generated for d in self._due
            )
            return EngineStats(
                running_sequences=len(self._due),
                waiting_requests=len(self._waiting),
                steps=self._emitted,
                cached_tokens=cached,
            )

    def memory_bytes(self) -> int:
        """No accelerator memory."""
        return 0

    def shutdown(self) -> None:
        """Stop everything still running (each sequence gets its final output) and the thread."""
        with self._lock:
            self._closed = True
            for sequences in self._running.values():
                for sequence in sequences:
                    sequence.stopped = True
            self._lock.notify()
        self._thread.join(timeout=10)

    def _admit(self, now: float) -> None:
        """Start waiting sequences while there is room (under the lock)."""
        while self._waiting and len(self._due) < self.max_batch_size:
            sequence = self._waiting.popleft()
            sequence.scheduled_ns = time.time_ns()
            prefill = len(sequence.request.input_ids) * self.config.prompt_token_s
            heapq.heappush(self._due, _Due(now + prefill, next(self._order), sequence))

    def _run(self) -> None:
        while True:
            with self._lock:
                ready = self._take_ready()
                if ready is None:
                    return
                self._emitted += len(ready)
            for callback, output in ready:
                try:
                    callback(output)
                except Exception:
                    logger.exception("the output callback of %s failed", output.request_id)

    def _take_ready(self) -> list[Ready] | None:
        """Wait for sequences that are due or stopped; ``None`` once shut down and empty."""
        while True:
            now = time.monotonic()
            ready = self._stopped() + self._advanced(now)
            if ready:
                self._admit(now)
                return ready
            if self._closed and not self._due and not self._waiting:
                return None
            self._lock.wait(self._due[0].at - now if self._due else None)

    def _stopped(self) -> list[Ready]:
        """Stopped sequences, taken out: their final outputs."""
        if not any(d.sequence.stopped for d in self._due) and not any(
            s.stopped for s in self._waiting
        ):
            return []
        stopped = [d.sequence for d in self._due if d.sequence.stopped]
        stopped += [s for s in self._waiting if s.stopped]
        self._due = [d for d in self._due if not d.sequence.stopped]
        heapq.heapify(self._due)
        self._waiting = deque(s for s in self._waiting if not s.stopped)
        return [self._finish(sequence, EngineFinishReason.CANCELLED) for sequence in stopped]

    def _advanced(self, now: float) -> list[Ready]:
        """Sequences whose next token is due: the streamed ones' outputs and the finished."""
        ready: list[Ready] = []
        while self._due and self._due[0].at <= now:
            due = heapq.heappop(self._due)
            sequence = due.sequence
            total = sequence.tokens.size
            paced = self.config.token_s > 0 or sequence.request.streaming
            sequence.advance(min(total, sequence.generated + 1) if paced else total)
            if sequence.generated >= total:
                ready.append(self._finish(sequence, EngineFinishReason.LENGTH))
                continue
            heapq.heappush(self._due, _Due(due.at + self.config.token_s, due.order, sequence))
            if sequence.request.streaming:
                ready.append((sequence.callback, sequence.output(None)))
        return ready

    def _finish(self, sequence: _Sequence, reason: EngineFinishReason) -> Ready:
        """Take a sequence out; its request leaves once all of its sequences did."""
        request_id = sequence.request.request_id
        siblings = self._running.get(request_id, [])
        if sequence in siblings:
            siblings.remove(sequence)
        if not siblings:
            self._running.pop(request_id, None)
        return sequence.callback, sequence.output(reason)
