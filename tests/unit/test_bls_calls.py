"""Ended decoupled BLS calls are held until a cancellation question asked after them returns."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from deploy.triton.pipeline.bls_calls import FinishedCalls, stream


class _Responses:
    """A decoupled call's response iterator, as the stub hands it to the model."""

    def __init__(self, count: int) -> None:
        self._left = list(range(count))

    def __iter__(self) -> _Responses:
        return self

    def __next__(self) -> int:
        if not self._left:
            raise StopIteration
        return self._left.pop(0)


class _Request:
    def __init__(self, count: int) -> None:
        self.responses = _Responses(count)

    def exec(self, *, decoupled: bool) -> _Responses:
        assert decoupled
        return self.responses


def _finished_call(finished: FinishedCalls, count: int = 3) -> weakref.ref[Any]:
    request = _Request(count)
    assert list(stream(request, finished)) == list(range(count))
    return weakref.ref(request.responses)


def test_a_finished_call_stays_held_until_released() -> None:
    finished = FinishedCalls()
    call = _finished_call(finished)
    gc.collect()
    assert call() is not None
    assert len(finished) == 1
    assert finished.release(finished.checkpoint()) == 1
    gc.collect()
    assert call() is None
    assert len(finished) == 0


def test_release_keeps_calls_retired_after_the_checkpoint() -> None:
    finished = FinishedCalls()
    first = _finished_call(finished)
    checkpoint = finished.checkpoint()
    second = _finished_call(finished)
    assert finished.release(checkpoint) == 1
    gc.collect()
    assert first() is None
    assert second() is not None
    assert finished.release(finished.checkpoint()) == 1
    gc.collect()
    assert second() is None


def test_a_call_left_early_is_held_too() -> None:
    finished = FinishedCalls()
    request = _Request(5)
    responses = stream(request, finished)
    assert next(responses) == 0
    responses.close()
    assert len(finished) == 1


def test_an_empty_checkpoint_releases_nothing() -> None:
    finished = FinishedCalls()
    checkpoint = finished.checkpoint()
    _finished_call(finished)
    assert finished.release(checkpoint) == 0
    assert len(finished) == 1


@pytest.mark.parametrize("count", [0, 1, 4])
def test_every_response_comes_through(count: int) -> None:
    finished = FinishedCalls()
    request = _Request(count)
    assert list(stream(request, finished)) == list(range(count))
