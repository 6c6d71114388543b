"""Streams under a deadline: one read in the caller's task, or several interleaved."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

import anyio

from gateway.errors import GatewayTimeoutError

E = TypeVar("E")
CLEANUP_GRACE_S = 10.0


class _Finished:
    pass


class _TimedOut:
    pass


@dataclass(frozen=True, slots=True)
class _Failed:
    error: Exception


def _timed_out(timeout_s: float) -> GatewayTimeoutError:
    return GatewayTimeoutError(f"The model did not finish within {timeout_s:.0f} s.")


async def merge(
    streams: Sequence[AsyncGenerator[E, None]], timeout_s: float
) -> AsyncGenerator[E, None]:
    """Interleave several event streams, each iterated whole in its own task, under a deadline.

    The queue is unbounded (one item per generated token at most), so producers never block on
    a consumer that left. Leaving cancels the producers; one that does not notice (a
    cancellation lost in ``asyncio.wait_for`` on Python 3.11) stops at its next event. Either
    way its stream is closed, which cancels the backend request.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[E | _Finished | _Failed | _TimedOut] = asyncio.Queue()
    consumer_left = False

    async def pump(stream: AsyncGenerator[E, None]) -> None:
        try:
            async with aclosing(stream):
                async for event in stream:
                    if consumer_left:
                        return
                    queue.put_nowait(event)
        except Exception as exc:
            queue.put_nowait(_Failed(exc))
        else:
            queue.put_nowait(_Finished())

    tasks = [asyncio.ensure_future(pump(stream)) for stream in streams]
    timer = loop.call_at(loop.time() + timeout_s, queue.put_nowait, _TimedOut())
    running = len(tasks)
    try:
        while running:
            item = await queue.get()
            if isinstance(item, _Finished):
                running -= 1
            elif isinstance(item, _Failed):
                raise item.error
            elif isinstance(item, _TimedOut):
                raise _timed_out(timeout_s)
            else:
                yield item
    finally:
        consumer_left = True
        timer.cancel()
        for task in tasks:
            task.cancel()
        with anyio.move_on_after(CLEANUP_GRACE_S, shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)


class Deadline:
    """The deadline of one choice's stream: one timer for the whole stream, not one per event.

    The reader sets ``waiting`` (and the task's ``cancelling`` count) while it awaits the
    stream: when the deadline passes then, the awaiting task is cancelled, and the reader turns
    the cancellation into the timeout (``raise_if_expired``, as ``asyncio.timeout`` does); when
    it passes while the consumer is busy elsewhere, ``expired`` says so at the next item.
    ``cancel`` once the stream ends.
    """

    __slots__ = ("cancelled", "cancelling", "expired", "handle", "timeout_s", "waiting")

    def __init__(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        self.timeout_s = timeout_s
        self.expired = False
        self.cancelled = False
        self.waiting: asyncio.Task[object] | None = None
        self.cancelling = 0
        self.handle = loop.call_at(loop.time() + timeout_s, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self.waiting is not None:
            self.cancelled = self.waiting.cancel()

    def raise_if_expired(self, task: asyncio.Task[object] | None) -> None:
        """Where the cancellation of ``task`` (waiting for the stream) was the deadline's, and
        nobody else's, the timeout is raised in its place."""
        if self.cancelled and task and task.uncancel() <= self.cancelling:
            raise self.error() from None

    def error(self) -> GatewayTimeoutError:
        """The timeout, as the client is told."""
        return _timed_out(self.timeout_s)

    def cancel(self) -> None:
        """The stream ended: the timer goes."""
        self.handle.cancel()
