"""The Triton backend: streams generations from TensorRT-LLM models over gRPC with tritonclient."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections import Counter
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import replace
from typing import Any

import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2

from adapters.contract import (
    BackendError,
    GenerationRequest,
    InvalidRequest,
    LoraNotCached,
    ModelTarget,
    TokenChunk,
)
from adapters.triton.beams import beam_inputs
from adapters.triton.config import ModelInputs, parse_model_config
from adapters.triton.errors import refusal_named
from adapters.triton.grpc.stream import (
    Call,
    Channels,
    GrpcCall,
    infer_request,
    map_triton_errors,
    open_stream,
    reconnecting_channel_args,
)
from adapters.triton.http.call import HttpStreams
from adapters.triton.http.pool import IDLE_MAX_AGE_S
from adapters.triton.http.wire import carries, generate_body
from adapters.triton.responses import Exchange
from adapters.triton.stopping import Stopper
from adapters.triton.tensors import build_inputs
from adapters.triton.wire import WireTensor

logger = logging.getLogger(__name__)

STOCK_BLS_WARNING = (
    "%s at %s is a stock TensorRT-LLM BLS: it gives its engine request an id of its own and "
    "never checks for cancellation, so a client that disconnects leaves its generation running "
    "to max_tokens, holding a batch slot that later requests wait for. Serve this model through "
    "the pipeline's ensemble instead (an abandoned request is stopped at once; streamed text "
    "goes through the stock postprocessing, which may drop leading spaces of SentencePiece "
    "tokens), or through triton-gateway's BLS (`triton-gateway deploy render`), which forwards "
    "cancellation and streams exact text."
)


class TritonBackend:
    """A ``Backend`` over one or more tritonservers: one gRPC channel per URL.

    ``connect_timeout_s`` bounds metadata calls (readiness, model configs); ``stop_timeout_s``
    bounds the stop request sent to the engine when an ensemble request is abandoned;
    ``max_reconnect_backoff_s`` (with no ``channel_args``) caps the time between attempts to
    reach a server that went away.
    """

    def __init__(
        self,
        *,
        connect_timeout_s: float = 5.0,
        stop_timeout_s: float = 2.0,
        channel_args: Sequence[tuple[str, Any]] | None = None,
        max_reconnect_backoff_s: float | None = None,
        http_keep_alive_s: float = IDLE_MAX_AGE_S,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        if channel_args is None and max_reconnect_backoff_s is not None:
            channel_args = reconnecting_channel_args(max_reconnect_backoff_s)
        self._channel_args = list(channel_args) if channel_args is not None else None
        self._clients: dict[str, triton_aio.InferenceServerClient] = {}
        self._http = HttpStreams(keep_alive_s=http_keep_alive_s)
        self._streams = Channels()
        self._models: dict[tuple[str, str], ModelInputs] = {}
        self._lora_sent: set[tuple[str, str, int]] = set()
        self._stopper = Stopper(self._open, stop_timeout_s)
        # A call's Triton id: its request's id (random) or this backend's, and the count of
        # calls so far (unique in this process without reading the kernel's random bytes).
        self._calls = itertools.count()
        self._unnamed = f"gen{os.urandom(4).hex()}"
        self.adapter_loads: Counter[tuple[str, str, str]] = Counter()
        """Requests that carried LoRA weights, by (URL, Triton model, ``first`` or ``evicted``):
        the adapter's first request to that server, or its resend after an eviction."""

    async def __aenter__(self) -> TritonBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def describe(
        self, target: ModelTarget, *, refresh: bool = False, deadline: float | None = None
    ) -> ModelInputs:
        """The target's declared inputs and options, read from Triton once (by the event loop
        time ``deadline``) and cached; a cached one is returned without arming a timer."""
        key = (target.url, target.triton_model)
        if not refresh and key in self._models:
            return self._models[key]
        async with asyncio.timeout_at(deadline):
            model = await self._read_model(target)
        if not model.stops_abandoned and key not in self._models:
            logger.warning(STOCK_BLS_WARNING, target.triton_model, target.url)
        self._models[key] = model
        return model

    async def _read_model(self, target: ModelTarget) -> ModelInputs:
        """The target's config, with what its engine's config adds."""
        model = await self._model_config(target.url, target.triton_model)
        if model.is_ensemble and model.engine_model:
            engine = await self._model_config(target.url, model.engine_model)
            model = replace(
                model,
                decoupled=engine.decoupled,
                guided_decoding=engine.guided_decoding,
                tokens_per_block=engine.tokens_per_block,
                max_beam_width=engine.max_beam_width,
                reuses_kv_cache=engine.reuses_kv_cache,
            )
        elif model.engine_model and model.engine_model != model.name:
            behind = await self._engine_config(target, model)
            model = replace(
                model,
                guided_decoding=behind.guided_decoding if behind else True,
                tokens_per_block=behind.tokens_per_block if behind else None,
                max_beam_width=behind.max_beam_width if behind else None,
                reuses_kv_cache=behind.reuses_kv_cache if behind else True,
            )
        if model.tokens_per_block is None:
            model = replace(model, tokens_per_block=target.tokens_per_block)
        return model

    async def _engine_config(self, target: ModelTarget, model: ModelInputs) -> ModelInputs | None:
        """A BLS's engine config; when it cannot be read, the engine decides whether it guides."""
        try:
            return await self._model_config(target.url, model.engine_model or "")
        except BackendError as exc:
            logger.debug("engine config of %s unreadable: %s", target.triton_model, exc)
            return None

    async def is_ready(self, target: ModelTarget) -> bool:
        """Whether the target model is loaded; an unreachable server is not ready."""
        try:
            with map_triton_errors(f"readiness of {target.triton_model}"):
                client = self._client(target.url)
                ready = await client.is_model_ready(
                    target.triton_model, client_timeout=self._connect_timeout_s
                )
        except BackendError as exc:
            logger.debug("%s at %s is not ready: %s", target.triton_model, target.url, exc)
            return False
        return bool(ready)

    async def prepare(self, target: ModelTarget, request: GenerationRequest) -> TritonRequest:
        """Read the target's inputs (once, then cached) and encode the request for them."""
        deadline = asyncio.get_running_loop().time() + request.timeout_s
        with map_triton_errors(f"describing {target.triton_model}"):
            model = await self.describe(target, deadline=deadline)
        return TritonRequest(self, target, request, model, deadline)

    async def generate(
        self, target: ModelTarget, request: GenerationRequest
    ) -> AsyncGenerator[TokenChunk, None]:
        """Prepare and stream at once, for a caller with nothing to decide in between."""
        prepared = await self.prepare(target, request)
        async with aclosing(prepared.stream()) as chunks:
            async for chunk in chunks:
                yield chunk

    @property
    def open_http_connections(self) -> int:
        """HTTP connections of streams still running (each stream holds one)."""
        return self._http.open_connections

    @property
    def idle_http_connections(self) -> int:
        """HTTP connections kept alive between streams, waiting for the next one."""
        return self._http.idle_connections

    def release_handoff(self, target: ModelTarget, handoff: bytes) -> None:
        """A stop request for the context phase call that answered ``handoff``: its engine
        frees the blocks it holds for the generation phase (TensorRT-LLM cancels a
        context-complete request so)."""
        call_id = self._stopper.handed_off.pop(handoff, None)
        if call_id is None:
            logger.warning("no context phase call known for a handoff to release")
            return
        self._stopper.stop_later(target.url, target.engine_model or target.triton_model, call_id)

    async def close(self) -> None:
        """Finish pending stop requests and close every channel."""
        await self._stopper.close()
        await self._http.close()
        await self._streams.close()
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    def _client(self, url: str) -> triton_aio.InferenceServerClient:
        client = self._clients.get(url)
        if client is None:
            client = triton_aio.InferenceServerClient(url, channel_args=self._channel_args)
            self._clients[url] = client
        return client

    async def _model_config(self, url: str, name: str) -> ModelInputs:
        with map_triton_errors(f"reading the config of {name}"):
            document = await self._client(url).get_model_config(
                name, as_json=True, client_timeout=self._connect_timeout_s
            )
        return parse_model_config(document)

    def _open(
        self,
        url: str,
        request: service_pb2.ModelInferRequest,
        timeout: float,
        metadata: Mapping[str, str] | None = None,
    ) -> Any:
        """Start a ``ModelStreamInfer`` call carrying one request on the client of ``url``."""
        return open_stream(self._client(url)._client_stub, request, timeout, metadata)

    def _call(
        self,
        target: ModelTarget,
        request: GenerationRequest,
        request_id: str,
        tensors: list[WireTensor],
        exchange: Exchange,
        deadline: float,
    ) -> Call:
        """The request on its way: over HTTP ``generate_stream`` where the target has an HTTP
        address (its model's transport is HTTP), JSON carries every input and an abandoned
        request is still stopped; else over gRPC ``ModelStreamInfer``. Triton notices a closed
        HTTP connection only when it writes, so a BLS request answered once (nothing written
        until the end, and no stop request to send) goes over gRPC, whose cancellation arrives
        at once. Both calls end at the deadline, an ensemble's by its stop request
        (``Stopper.release``)."""
        outputs = exchange.outputs
        model = exchange.model
        stoppable = exchange.streaming or model.is_ensemble or model.is_engine
        # JSON flattens the beam axis of the outputs: beams go over gRPC.
        single = request.params.beam is None
        # An ensemble's call outlives its deadline, for its stop request and drain
        # (Stopper.release).
        keep_open = model.is_ensemble
        priority = request_priority(model, request.priority)
        phase = request.phase
        if target.http_url is not None and stoppable and single and carries(tensors):
            body = generate_body(request_id, tensors, priority=priority, request_type=phase)
            return self._http.call(
                target.http_url, target.triton_model, body, request.trace_headers, deadline,
                keep_open=keep_open,
            )  # fmt: skip
        message = infer_request(
            target.triton_model, request_id, tensors, outputs, priority=priority, request_type=phase
        )
        timeout = _remaining(deadline) + (self._stopper.ending_s if keep_open else 0.0)
        return GrpcCall(
            self._streams, target.url, message, timeout, request.trace_headers, outputs,
            deadline=deadline if keep_open else None,
        )  # fmt: skip


def request_priority(model: ModelInputs, priority: int) -> int:
    """The priority to send Triton for a caller's ``priority``: none (0) where the model
    declares no ``priority_levels``, else at most its lowest level."""
    return min(priority, model.priority_levels) if model.priority_levels else 0


def _remaining(deadline: float) -> float:
    return max(deadline - asyncio.get_running_loop().time(), 0.0)


class TritonRequest:
    """A request encoded for one Triton model (its tensors, the exchange that decodes its
    answers) and, once sent, its call. A LoRA request carries its adapter's weights to a server
    that has not seen them, and again once where the engine evicted them before any output."""

    def __init__(
        self,
        backend: TritonBackend,
        target: ModelTarget,
        request: GenerationRequest,
        model: ModelInputs,
        deadline: float,
    ) -> None:
        self._backend = backend
        self._target = target
        self._request = request
        self._model = model
        self._deadline = deadline
        self._call: Call | None = None
        lora = request.lora
        self._lora_key = None if lora is None else (target.url, target.triton_model, lora.task_id)
        self._weights = self._lora_key is not None and self._lora_key not in backend._lora_sent
        self._encode()

    def _encode(self) -> None:
        backend, request, model = self._backend, self._request, self._model
        self._request_id = f"{request.request_id or backend._unnamed}-{next(backend._calls):x}"
        self._operation = f"request {self._request_id} to {self._target.triton_model}"
        self._exchange = Exchange.of(request, model)
        tensors = build_inputs(request, model, lora_weights=self._weights)
        if request.params.beam is not None:
            tensors.extend(
                beam_inputs(request.params.beam, model, logprobs=request.params.logprobs)
            )
        self._tensors = tensors

    def send(self) -> None:
        """Put the request on its way now: on a ready HTTP connection (kept alive, or the
        spare), else on one dialled meanwhile (a gRPC call goes as it is opened)."""
        if self._call is None:
            self._open().start()

    def _open(self) -> Call:
        """The request's call, opened: a gRPC call goes at once, an HTTP one at its first read
        (on a kept-alive connection where one is idle) unless ``send`` sent it."""
        backend, target = self._backend, self._target
        if self._lora_key is not None and self._weights:
            reason = "evicted" if self._lora_key in backend._lora_sent else "first"
            backend.adapter_loads[(target.url, target.triton_model, reason)] += 1
        call = backend._call(
            target, self._request, self._request_id, self._tensors, self._exchange, self._deadline
        )
        logger.debug(
            "%s: streaming=%s via %s",
            self._operation,
            self._exchange.streaming,
            type(call).__name__,
        )
        self._call = call
        return call

    async def stream(self) -> AsyncGenerator[TokenChunk, None]:
        """The call's chunks: its responses fed to the exchange; the call released on every
        exit (``Stopper.release``)."""
        params = self._request.params
        yielded = False
        while True:
            call, exchange = self._call or self._open(), self._exchange
            try:
                with map_triton_errors(self._operation):
                    while not exchange.finished:
                        chunk = exchange.on_replies(await call.read())
                        if chunk is not None:
                            if chunk.context_phase_params is not None:
                                self._backend._stopper.handed_off.remember(
                                    chunk.context_phase_params, self._request_id
                                )
                            yielded = True
                            yield chunk
                    await call.drain()
            except LoraNotCached:
                lora = self._request.lora
                if yielded or self._weights or lora is None or lora.weights is None:
                    raise
                logger.info("LoRA task %d was evicted; resending its weights", lora.task_id)
            except InvalidRequest as exc:
                # Named where a refusal is caught: a request Triton serves never pays for it.
                named = refusal_named(exc, params.guide, params.beam)
                if named is None:
                    raise
                raise named from exc
            else:
                if self._lora_key is not None:
                    self._backend._lora_sent.add(self._lora_key)
                return
            finally:
                self.discard()
            self._weights = True
            self._encode()

    def discard(self) -> None:
        """Release the call, if one was opened: an unfinished one is stopped at its engine."""
        call, self._call = self._call, None
        if call is not None:
            self._backend._stopper.release(
                call, self._exchange, self._target, self._request_id, self._operation
            )
