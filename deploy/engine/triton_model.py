"""Triton Python-backend model serving the torch engine under the `tensorrt_llm` tensor contract."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import triton_python_backend_utils as pb_utils

from deploy.engine.config import ModelSettings, settings_from_model_config
from deploy.engine.scheduler import Engine, validate_request
from deploy.engine.types import EngineError, SequenceOutput
from deploy.engine.wire import ItemContext, is_stop_request, parse_items, response_tensors

logger = logging.getLogger(__name__)

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_NO_STOP_ID = "A request id must be provided to stop a request"


@dataclass(eq=False)
class _Pending:
    """A Triton request in flight: where its responses go and how many sequences are left."""

    request: Any
    triton_id: str
    sender: Any
    requested: frozenset[str]
    contexts: dict[str, ItemContext]
    remaining: int
    closed: bool = False
    cancel_sent: bool = False
    responses: list[Any] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
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
            if response is None:
                self.sender.send(flags=_FINAL)
            else:
                self.sender.send(response, flags=_FINAL)


_STRING_INPUTS = frozenset({"guided_decoding_guide_type", "guided_decoding_guide"})


def _as_array(tensor: Any) -> npt.NDArray[Any]:
    # Numeric tensors cross the stub boundary through DLPack: the 2.51 stub's own numpy
    # conversion breaks when the environment has numpy 2 (as on the CUDA test machines).
    if tensor.name() in _STRING_INPUTS:
        return np.asarray(tensor.as_numpy())
    array: npt.NDArray[Any] = torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).cpu().numpy()
    return array


def _output(name: str, value: npt.NDArray[Any]) -> Any:
    return pb_utils.Tensor.from_dlpack(name, torch.from_numpy(np.ascontiguousarray(value)))


def _inputs(request: Any) -> dict[str, Any]:
    return {tensor.name(): _as_array(tensor) for tensor in request.inputs()}


def _error_response(message: str) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


class TritonPythonModel:
    """The `tensorrt_llm` model: decoupled, in-flight batched, backed by `deploy.engine`."""

    def initialize(self, args: dict[str, str]) -> None:
        """Read the parameters, load the model and start the engine and cancellation watcher."""
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
        model_config = json.loads(args["model_config"])
        self._settings: ModelSettings = settings_from_model_config(model_config)
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self._engine = Engine.from_config(self._settings.engine)
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._keys = itertools.count()
        self._stopping = threading.Event()
        self._outbox: queue.SimpleQueue[tuple[_Pending, Any, bool] | None] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_loop, name="engine-sender", daemon=True)
        self._watcher = threading.Thread(
            target=self._watch_cancellation, name="engine-cancellation", daemon=True
        )
        self._sender.start()
        self._watcher.start()

    def execute(self, requests: list[Any]) -> list[Any] | None:
        """Hand requests to the engine; responses follow from the engine thread."""
        if self._decoupled:
            for request in requests:
                self._accept(request, request.get_response_sender())
            return None
        states = [self._accept(request, None) for request in requests]
        responses = []
        for state in states:
            state.done.wait()
            responses.append(state.responses[-1])
        return responses

    def finalize(self) -> None:
        """Cancel what is still running (each request still gets its final response)."""
        self._stopping.set()
        self._engine.shutdown()
        self._outbox.put(None)
        self._sender.join(timeout=10)
        self._watcher.join(timeout=5)

    def _accept(self, request: Any, sender: Any) -> _Pending:
        triton_id = request.request_id()
        state = _Pending(request, triton_id, sender, frozenset(), {}, remaining=0)
        try:
            inputs = _inputs(request)
            if is_stop_request(inputs):
                self._stop(triton_id, state)
                return state
            key = f"{next(self._keys)}:{triton_id}"
            items = parse_items(
                inputs,
                id_prefix=key,
                exclude_input_default=self._settings.exclude_input_in_output,
            )
            self._check(items)
        except EngineError as exc:
            self._deliver(state, _error_response(str(exc)), final=True)
            return state
        except Exception as exc:
            logger.exception("could not read request %r", triton_id)
            self._deliver(state, _error_response(f"invalid request: {exc}"), final=True)
            return state
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
        return state

    def _check(self, items: list[tuple[Any, ItemContext]]) -> None:
        engine = self._engine
        for request, _ in items:
            validate_request(
                request, engine.runner.vocab_size, engine.max_seq_len, engine.max_batch_size
            )
            if not self._decoupled and (
                len(items) > 1 or request.streaming or request.num_return_sequences > 1
            ):
                raise EngineError(
                    "streaming, batch size > 1 and num_return_sequences > 1 need the model "
                    "to be deployed in decoupled mode"
                )

    def _stop(self, triton_id: str, state: _Pending) -> None:
        if not triton_id:
            self._deliver(state, _error_response(_NO_STOP_ID), final=True)
            return
        with self._lock:
            targets = [p for p in self._pending.values() if p.triton_id == triton_id]
        for target in targets:
            for engine_id in target.contexts:
                self._engine.stop(engine_id)
        self._deliver(state, None, final=True)

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
        try:
            tensors = response_tensors(output, state.contexts[output.request_id], state.requested)
            response = pb_utils.InferenceResponse(
                output_tensors=[_output(name, value) for name, value in tensors.items()]
            )
        except Exception as exc:
            logger.exception("could not build a response for request %r", state.triton_id)
            self._fail(state, f"could not build the response: {exc}")
            return
        if final and not self._close(state):
            return
        self._deliver(state, response, final=final)

    def _deliver(self, state: _Pending, response: Any, *, final: bool) -> None:
        if state.sender is None:
            state.responses.append(response)
            if final:
                with state.final_guard:
                    state.final_sent = True
                state.done.set()
            return
        self._outbox.put((state, response, final))

    def _send_loop(self) -> None:
        """Send responses in order, off the engine thread: each send is an IPC round trip."""
        while (item := self._outbox.get()) is not None:
            state, response, final = item
            try:
                state.send(response, final=final)
            except Exception:
                logger.warning("could not send a response for request %r", state.triton_id)
                if final and response is not None:
                    # Triton waits for the final flag; deliver it without the data that failed.
                    with contextlib.suppress(Exception):
                        state.send(None, final=True)

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
