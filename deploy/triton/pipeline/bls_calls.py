"""Decoupled BLS calls whose responses are freed on a Python thread, never on the stub's own.

The Python backend's stub (Triton 2.51, and its source since) keeps each decoupled ``exec``
call's response iterator, with every response of the call and their NumPy arrays, in a map.
Once the call has ended, its stub-to-parent thread erases it from that map, and that thread
holds no GIL and has no Python thread state. Where the model has already dropped the iterator,
the erase is the last reference: the responses' arrays are released there, the interpreter's
heap and reference counts get corrupted, and the stub dies later at some allocation (a
segfault in ``_PyObject_Malloc``), leaving every later request to the model hanging.

The erase is a message in a queue that the same thread works through in order, and every
``is_cancelled()`` question a model asks goes through that queue too. So the model keeps each
finished call here, and lets go of those finished before an ``is_cancelled()`` question only
once its answer came back: the stub has let go of them by then, and the last reference goes on
a Python thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any


class FinishedCalls:
    """Response iterators of ended calls, held until the stub has erased its own references."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[tuple[int, Any]] = []
        self._count = 0

    def retire(self, iterator: Any) -> None:
        """Hold a call's iterator, which the caller has done with."""
        with self._lock:
            self._count += 1
            self._held.append((self._count, iterator))

    def checkpoint(self) -> int:
        """A mark for :meth:`release`: every call retired so far."""
        with self._lock:
            return self._count

    def release(self, checkpoint: int) -> int:
        """Let go of the calls retired up to ``checkpoint``, once a cancellation question asked
        after it has been answered; how many."""
        with self._lock:
            done = [held for held in self._held if held[0] <= checkpoint]
            self._held = [held for held in self._held if held[0] > checkpoint]
        # The responses are freed here, on this thread, with the GIL.
        released = len(done)
        del done
        return released

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


def stream(request: Any, finished: FinishedCalls) -> Iterator[Any]:
    """The responses of a decoupled BLS ``request``; its iterator is then held by ``finished``."""
    responses = request.exec(decoupled=True)
    try:
        yield from responses
    finally:
        finished.retire(responses)
