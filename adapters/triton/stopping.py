"""Abandoned Triton calls stopped at their engine: a stop request for an engine's, a stop and a
drain for an ensemble's (a running ensemble request that is cancelled stays counted in flight in
Triton 2.51 for good), all in the background and awaited on close."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any

import grpc  # type: ignore[import-untyped]

from adapters.contract import ModelTarget
from adapters.triton.errors import classify
from adapters.triton.grpc.stream import Call, CallOpener, infer_request, map_triton_errors
from adapters.triton.responses import Exchange
from adapters.triton.tensors import stop_request_inputs

logger = logging.getLogger(__name__)
HANDOFFS_KEPT = 4096
"""Context phase answers whose call a later release of their handoff may still name."""
_RESTOP_S = 0.5
"""How long an abandoned ensemble call has to end after a stop request before it is sent again."""


class HandedOff:
    """The Triton ids of the context phase calls that answered the latest handoffs, by
    handoff: a generation phase that will not come has its context call stopped, which frees
    the blocks held for it. The oldest are forgotten (long taken, or freed by their engine's
    ``kv_transfer_timeout_ms``)."""

    def __init__(self, kept: int = HANDOFFS_KEPT) -> None:
        self._kept = kept
        self._calls: OrderedDict[bytes, str] = OrderedDict()

    def remember(self, handoff: bytes, call_id: str) -> None:
        """The call ``call_id`` answered ``handoff``."""
        self._calls[handoff] = call_id
        while len(self._calls) > self._kept:
            self._calls.popitem(last=False)

    def pop(self, handoff: bytes, default: str | None = None) -> str | None:
        """The call that answered ``handoff``, forgotten; ``default`` if unknown."""
        return self._calls.pop(handoff, default)


class Stopper:
    """Ends calls, stopping abandoned ones at their engine; ``stop_timeout_s`` bounds each stop
    request."""

    def __init__(self, open_call: CallOpener, stop_timeout_s: float) -> None:
        self._open = open_call
        self._stop_timeout_s = stop_timeout_s
        self.ending_s = 2 * stop_timeout_s
        """How long ending an abandoned ensemble call may take: its stop requests and the
        drain of its call."""
        self._background: set[asyncio.Task[None]] = set()
        self.handed_off = HandedOff()

    async def close(self) -> None:
        """Finish pending stops within ``ending_s``; cancel what is left."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.ending_s)
        left = list(self._background)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    def release(
        self, call: Call, exchange: Exchange, target: ModelTarget, request_id: str, operation: str
    ) -> None:
        """The one place a call ends; an abandoned one is stopped at its engine.

        An ensemble's call is left open until the engine ended its request and the call was read
        to its end: a running ensemble request that is cancelled (its call closed) stays counted
        in flight in Triton 2.51 for good, and the server's shutdown waits for it. Any other
        abandoned call is closed at once, which cancels it.
        """
        if exchange.finished:
            if not call.ended():
                # The final response (an error's, as a rule) came before the call's end: the
                # call is read to its end rather than cancelled while Triton completes it, a
                # race in which Triton before 24.12 can crash (server#7840, server#8034).
                self._later(self._finish(call))
            return
        logger.info("%s abandoned before its final response; stopping it", operation)
        model = exchange.model
        if not (model.is_ensemble or model.is_engine):
            call.cancel()
            return
        engine_model = target.engine_model or model.engine_model
        if engine_model is None:
            logger.warning("no engine model known to stop request %s", request_id)
            call.cancel()
            return
        if model.is_ensemble:
            self._later(self._stop_and_drain(call, target.url, engine_model, request_id))
            return
        call.cancel()
        self._later(self._stop_once(target.url, engine_model, request_id))

    def stop_later(self, url: str, engine_model: str, request_id: str) -> None:
        """Send a stop request for ``request_id`` to ``engine_model`` at ``url`` in the
        background: the request's call has ended, its engine may still hold its KV cache."""
        self._later(self._stop_once(url, engine_model, request_id))

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background; ``close`` waits for it."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _stop_and_drain(
        self, call: Call, url: str, engine_model: str, request_id: str
    ) -> None:
        """Stop an ensemble's engine request and read its call to the end, then close it.

        The stop is sent again while the call has not ended: one can overtake its request (still
        in the ensemble's preprocessing, its id unknown to the engine, which then ignores the
        stop) or time out. The call's end is awaited for ``ending_s`` in all."""
        drained = asyncio.ensure_future(call.drain(self.ending_s))
        failures = 0
        try:
            while not drained.done():
                stop = asyncio.ensure_future(self._stop(url, engine_model, request_id))
                # The call's end ends the wait, a stop still on its way included.
                await asyncio.wait({drained, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not stop.done():
                    stop.cancel()
                    break
                if (failed := stop.exception()) is not None:
                    failures += 1
                    log = logger.warning if failures == 1 else logger.debug
                    log("stopping request %s failed: %s", request_id, failed)
                await asyncio.wait({drained}, timeout=_RESTOP_S)
            if not await drained:
                logger.warning(
                    "request %s did not end within %.1f s of its stop request, or its stream "
                    "broke; closed",
                    request_id,
                    self.ending_s,
                )
        except Exception:
            logger.warning("ending abandoned request %s failed", request_id, exc_info=True)
        finally:
            drained.cancel()
            call.cancel()

    async def _finish(self, call: Call) -> None:
        """Read a call whose request ended to its end; one that does not end is cancelled."""
        try:
            await call.drain(self._stop_timeout_s)
        except Exception:
            logger.debug("reading an ended call to its end failed", exc_info=True)
        finally:
            call.cancel()

    async def _stop_once(self, url: str, engine_model: str, request_id: str) -> None:
        """Stop an engine request whose call was closed (Triton cancelled it as well)."""
        try:
            await self._stop(url, engine_model, request_id)
        except Exception as exc:
            logger.warning("stopping request %s failed: %s", request_id, exc)

    async def _stop(self, url: str, engine_model: str, request_id: str) -> None:
        """One stop request; a failure is raised as the contract's ``BackendError``."""
        message = infer_request(engine_model, request_id, stop_request_inputs(), None)
        with map_triton_errors(f"stop request {request_id} to {engine_model}"):
            call = self._open(url, message, self._stop_timeout_s)
            try:
                while (response := await call.read()) is not grpc.aio.EOF:
                    if response.error_message:
                        raise classify(response.error_message)
            finally:
                call.cancel()
        logger.debug("stopped request %s on %s", request_id, engine_model)
