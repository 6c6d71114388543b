"""Triton Python-backend model serving an engine under the `tensorrt_llm` tensor contract: the
torch engine, or the paced load-test engine (``load_test_model: true``), which needs no torch."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import triton_python_backend_utils as pb_utils

from deploy.triton.engine.checks import validate_request
from deploy.triton.engine.config import (
    ModelParameters,
    is_first_instance,
    settings_from_model_config,
)
from deploy.triton.engine.outputs import ItemContext, OutputLayout, response_tensors
from deploy.triton.engine.tensor_io import OutputTensors, inputs_of
from deploy.triton.engine.triton_metrics import EngineMetrics, stat_values
from deploy.triton.engine.types import EngineError, SequenceOutput, ServingEngine
from deploy.triton.engine.wire import is_stop_request, parse_items
from deploy.triton.loadtest.paced import PacedConfig, PacedEngine
from deploy.triton.watchdog import ParentWatchdog

logger = logging.getLogger(__name__)

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_NO_STOP_ID = "Trying to stop a request but request ID is not provided"
# The C++ backend's words for what only a decoupled model can do.
_STREAMING_NEEDS_DECOUPLED = (
    "Streaming is only supported if model is deployed using decoupled mode."
)
_BATCH_NEEDS_DECOUPLED = (
    "Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy"
)
_SEQUENCES_NEED_DECOUPLED = (
    "num_return_sequences > 1 requires the tensorrt_llm backend to be using decoupled "
    "transaction policy: each sequence is a response of its own"
)

_HANDED_OFF_KEPT = 4096
"""Answered context-only requests whose engine ids a stop request may still name (the oldest
are forgotten: their blocks were taken or freed after ``kv_transfer_timeout_ms`` long since)."""

Outgoing = tuple["_Pending", Any, bool]
"""A response on its way: its request, the response, and whether it is the final one."""


@dataclass(eq=False)
class _Pending:
    """A Triton request in flight: where its responses go and how many sequences are left."""

    request: Any
    triton_id: str
    sender: Any
    requested: frozenset[str]
    contexts: dict[str, ItemContext]
    remaining: int
    outbox: queue.SimpleQueue[Outgoing | None]
    """Where its responses wait for their sender thread (the same for all of them: in order)."""
    closed: bool = False
    cancel_sent: bool = False
    # Triton frees a request once its final response is out; asking it `is_cancelled()` then,
    # or while that response is being sent, crashes tritonserver (seen with 2.51).
    final_guard: threading.Lock = field(default_factory=threading.Lock)
    final_sent: bool = False

    def is_cancelled(self) -> bool:
        """Whether the client cancelled; never asks Triton once the final response is out."""
        with self.final_guard:
            if self.final_sent:
                return False
            check = getattr(self.sender, "is_cancelled", None) or self.request.is_cancelled
            return bool(check())

    def send(self, response: Any, *, final: bool) -> None:
        """Send one response; the final one under the guard that cancellation polling takes."""
        if not final:
            self.sender.send(response)
            return
        with self.final_guard:
            self.final_sent = True
            self.sender.send(response, flags=_FINAL)


def _error_response(message: str) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


def request_parameter(request: Any, name: str) -> object:
    """A request parameter (``request_type``, as TensorRT-LLM reads it), or None."""
    try:
        values = json.loads(request.parameters() or "{}")
    except (AttributeError, ValueError):
        return None
    return values.get(name) if isinstance(values, dict) else None


def senders_of(settings: ModelParameters) -> int:
    """Threads sending responses: the load-test engine's setting; one for the torch engine,
    whose step loop would lose the GIL to more (measured: slower at every load)."""
    return settings.engine.senders if isinstance(settings.engine, PacedConfig) else 1


def load_engine(settings: ModelParameters) -> ServingEngine:
    """The engine the parameters name; torch is imported only for the torch engine."""
    if isinstance(settings.engine, PacedConfig):
        logger.warning(
            "the load-test engine serves made-up tokens (benchmarks only): %s", settings.engine
        )
        return PacedEngine(settings.engine)
    from deploy.triton.engine.scheduler import Engine

    return Engine.from_config(settings.engine)


class TritonPythonModel:
    """The `tensorrt_llm` model: in-flight batched in both transaction policies.

    `execute` only hands requests to the engine and returns; responses go out through each
    request's response sender from the engine's threads. A non-decoupled model gets exactly one
    response per request that way (Triton 24.06+), so requests still join running batches and
    stop requests and cancellation reach running generations, as with the C++ backend.
    """

    def initialize(self, args: dict[str, str]) -> None:
        """Read the parameters, load the model and start the engine and its helper threads."""
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
        model_config = json.loads(args["model_config"])
        self._settings: ModelParameters = settings_from_model_config(model_config)
        self._layout = OutputLayout.from_model_config(model_config)
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self._engine = load_engine(self._settings)
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._handed_off: OrderedDict[str, list[str]] = OrderedDict()
        """Engine ids of answered context-only requests by Triton id: a stop request for one
        frees the blocks its engine still holds for a generation engine."""
        self._keys = itertools.count()
        self._stopping = threading.Event()
        self._outboxes: list[queue.SimpleQueue[Outgoing | None]] = [
            queue.SimpleQueue() for _ in range(senders_of(self._settings))
        ]
        self._lanes = itertools.cycle(self._outboxes)
        self._tensors = OutputTensors()
        self._senders = [
            threading.Thread(
                target=self._send_loop, args=(outbox,), name=f"engine-sender-{index}", daemon=True
            )
            for index, outbox in enumerate(self._outboxes)
        ]
        self._watcher = threading.Thread(
            target=self._watch_cancellation, name="engine-cancellation", daemon=True
        )
        for sender in self._senders:
            sender.start()
        self._watcher.start()
        self._metrics = EngineMetrics(
            args.get("model_name", "tensorrt_llm"),
            args.get("model_version", "1"),
            self._stat_values,
            self._settings.stats_check_period_ms / 1000.0,
        )
        if is_first_instance(
            model_config,
            args.get("model_instance_name", ""),
            args.get("model_instance_device_id", "0"),
        ):
            self._metrics.start()
        # The engine's threads call into tritonserver: one stuck in such a call as the server
        # dies must not keep the stub alive.
        self._watchdog = ParentWatchdog().start()

    def execute(self, requests: list[Any]) -> None:
        """Hand requests to the engine; responses follow from the engine's threads."""
        for request in requests:
            self._accept(request, request.get_response_sender())

    def finalize(self) -> None:
        """Cancel what is still running (each request still gets its final response).

        The watchdog keeps running: a server that gives up waiting for this model (its exit
        timeout) is gone when this returns, and a thread that outlived its join would keep the
        interpreter from exiting."""
        self._stopping.set()
        self._metrics.stop()
        self._engine.shutdown()
        for outbox in self._outboxes:
            outbox.put(None)
        for sender in self._senders:
            sender.join(timeout=10)
        self._watcher.join(timeout=5)
        self._tensors.clear()

    def _stat_values(self) -> dict[tuple[str, str], float]:
        engine = self._engine
        gpu = engine.memory_bytes()
        return stat_values(
            engine.stats(),
            max_batch_size=engine.max_batch_size,
            gpu_bytes=gpu,
        )

    def _accept(self, request: Any, sender: Any) -> None:
        triton_id = request.request_id()
        state = _Pending(request, triton_id, sender, frozenset(), {}, 0, next(self._lanes))
        try:
            inputs = inputs_of(request)
            if is_stop_request(inputs):
                self._stop(triton_id, state)
                return
            key = f"{next(self._keys)}:{triton_id}"
            items = self._checked(
                parse_items(
                    inputs,
                    id_prefix=key,
                    exclude_input_default=self._settings.exclude_input_in_output,
                    vocab_size=self._engine.vocab_size,
                    request_type=request_parameter(request, "request_type"),
                )
            )
        except EngineError as exc:
            self._deliver(state, _error_response(str(exc)), final=True)
            return
        except Exception as exc:
            logger.exception("could not read request %r", triton_id)
            self._deliver(state, _error_response(f"invalid request: {exc}"), final=True)
            return
        state.requested = frozenset(request.requested_output_names())
        state.contexts = {engine_request.request_id: ctx for engine_request, ctx in items}
        state.remaining = sum(req.num_return_sequences for req, _ in items)
        with self._lock:
            self._pending[key] = state
        for engine_request, _ in items:
            try:
                self._engine.submit(engine_request, functools.partial(self._on_output, state))
            except EngineError as exc:
                self._fail(state, str(exc))
                break

    def _checked(self, items: list[tuple[Any, ItemContext]]) -> list[tuple[Any, ItemContext]]:
        """Validate every item before any runs; contexts learn each item's effective budget."""
        engine = self._engine
        checked = []
        for request, context in items:
            if not self._decoupled:
                if request.streaming:
                    raise EngineError(_STREAMING_NEEDS_DECOUPLED)
                if len(items) > 1:
                    raise EngineError(_BATCH_NEEDS_DECOUPLED)
                if request.num_return_sequences > 1:
                    raise EngineError(_SEQUENCES_NEED_DECOUPLED)
            budget = validate_request(
                request,
                engine.vocab_size,
                engine.max_seq_len,
                engine.max_batch_size,
                engine.max_beam_width,
            )
            checked.append((request, dataclasses.replace(context, max_new_tokens=budget)))
        return checked

    def _stop(self, triton_id: str, state: _Pending) -> None:
        if not triton_id:
            self._deliver(state, _error_response(_NO_STOP_ID), final=True)
            return
        with self._lock:
            targets = [p for p in self._pending.values() if p.triton_id == triton_id]
            handed_off = self._handed_off.pop(triton_id, [])
        for target in targets:
            for engine_id in target.contexts:
                self._engine.stop(engine_id)
        for engine_id in handed_off:
            self._engine.stop(engine_id)
        # The C++ backend answers a stop request with an empty response, in both policies.
        self._deliver(state, pb_utils.InferenceResponse(output_tensors=[]), final=True)

    def _close(self, state: _Pending) -> bool:
        with self._lock:
            if state.closed:
                return False
            state.closed = True
            for key, pending in list(self._pending.items()):
                if pending is state:
                    del self._pending[key]
        return True

    def _fail(self, state: _Pending, message: str) -> None:
        if self._close(state):
            for engine_id in state.contexts:
                self._engine.stop(engine_id)
            self._deliver(state, _error_response(message), final=True)

    def _on_output(self, state: _Pending, output: SequenceOutput) -> None:
        if output.error is not None:
            self._fail(state, output.error)
            return
        with self._lock:
            if state.closed:
                return
            if output.finished:
                state.remaining -= 1
            final = state.remaining <= 0
            if output.context_phase_params is not None:
                self._handed_off.setdefault(state.triton_id, []).append(output.request_id)
                while len(self._handed_off) > _HANDED_OFF_KEPT:
                    self._handed_off.popitem(last=False)
        context = state.contexts[output.request_id]
        if output.finished:
            self._metrics.completed(context.prompt.size, output.cached_tokens - context.prompt.size)
        try:
            tensors = response_tensors(output, context, state.requested, self._layout)
            response = pb_utils.InferenceResponse(
                output_tensors=[self._tensors.tensor(name, v) for name, v in tensors.items()]
            )
        except Exception as exc:
            logger.exception("could not build a response for request %r", state.triton_id)
            self._fail(state, f"could not build the response: {exc}")
            return
        if final and not self._close(state):
            return
        self._deliver(state, response, final=final)

    def _deliver(self, state: _Pending, response: Any, *, final: bool) -> None:
        state.outbox.put((state, response, final))

    def _send_loop(self, outbox: queue.SimpleQueue[Outgoing | None]) -> None:
        """Send the responses of one outbox in order, off the engine thread: each send is an IPC
        round trip to tritonserver, which the thread waits out without the GIL."""
        while (item := outbox.get()) is not None:
            state, response, final = item
            try:
                state.send(response, final=final)
            except Exception:
                logger.warning("could not send a response for request %r", state.triton_id)
                if final:
                    # Triton waits for the final flag; deliver it without the data that failed.
                    with contextlib.suppress(Exception):
                        state.send(_error_response("could not send the response"), final=True)

    def _watch_cancellation(self) -> None:
        period = self._settings.cancellation_check_period_ms / 1000.0
        while not self._stopping.wait(period):
            with self._lock:
                states = [s for s in self._pending.values() if not s.cancel_sent]
            for state in states:
                try:
                    cancelled = state.is_cancelled()
                except Exception:
                    logger.debug("cancellation check failed for %r", state.triton_id)
                    continue
                if cancelled:
                    state.cancel_sent = True
                    logger.info("request %r cancelled by the client", state.triton_id)
                    for engine_id in state.contexts:
                        self._engine.stop(engine_id)
