"""The engine's outputs on their way to the requests' callbacks, and the requests still running.

The engine thread queues each output as an iteration makes it and delivers the iteration's
outputs once its statistics are published, so whoever receives a final output finds its
blocks already returned. A request counts as running from its submission until every one of
its sequences has had its final output; its id cannot be submitted again meanwhile.
"""

from __future__ import annotations

import logging
import threading

from deploy.triton.engine.batch import unstarted_outputs
from deploy.triton.engine.context import Submission
from deploy.triton.engine.types import (
    EngineError,
    EngineFinishReason,
    OutputCallback,
    SequenceOutput,
)

logger = logging.getLogger(__name__)


class Delivery:
    """Outputs queued by the engine thread, delivered at the end of each iteration."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        """Each running request's sequences that have not had their final output yet."""
        self._due: list[tuple[OutputCallback, SequenceOutput]] = []

    def register(self, request_id: str, sequences: int) -> None:
        """A submitted request now runs until its ``sequences`` have each had a final output;
        raises ``EngineError`` while a request of that id still runs."""
        with self._lock:
            if request_id in self._running:
                raise EngineError(f"request id {request_id!r} is already running")
            self._running[request_id] = sequences

    def queue(self, callback: OutputCallback, output: SequenceOutput) -> None:
        """An output, delivered with the rest of its iteration's."""
        self._due.append((callback, output))

    def unstarted(self, entry: Submission, reason: EngineFinishReason, error: str | None) -> None:
        """The final outputs of a request that never ran (cancelled, failed or shut down)."""
        for output in unstarted_outputs(entry.request, reason, error):
            self.queue(entry.callback, output)

    def deliver(self) -> None:
        """Every queued output to its callback, in order; a failing callback is logged."""
        due, self._due = self._due, []
        for callback, output in due:
            if output.finished:
                self._finished(output.request_id)
            try:
                callback(output)
            except Exception:
                logger.exception("output callback of request %s failed", output.request_id)

    def _finished(self, request_id: str) -> None:
        with self._lock:
            left = self._running.get(request_id, 1) - 1
            if left > 0:
                self._running[request_id] = left
            else:
                self._running.pop(request_id, None)
