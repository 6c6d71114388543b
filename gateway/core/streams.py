"""Several streams interleaved under a deadline, each iterated whole in its own task."""

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


def timed_out(timeout_s: float) -> GatewayTimeoutError:
    """The timeout of a generation past ``timeout_s``, as the client is told."""
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
                raise timed_out(timeout_s)
            else:
                yield item
    finally:
        consumer_left = True
        timer.cancel()
        for task in tasks:
            task.cancel()
        with anyio.move_on_after(CLEANUP_GRACE_S, shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)
