"""An abandoned ensemble call is stopped at its engine until it ends: a stop that overtook its
request (ignored by the engine) or timed out is sent again, within the ending's budget."""

from __future__ import annotations

import asyncio
import logging

import pytest

from adapters.triton.stopping import HandedOff, Stopper


class EndingCall:
    """A call that ends once ``end`` is called; what was done to it."""

    def __init__(self) -> None:
        self.ended_ = asyncio.Event()
        self.cancelled = False
        self.drained = False

    def end(self) -> None:
        self.ended_.set()

    async def read(self) -> None:
        await self.ended_.wait()

    async def drain(self, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                await self.ended_.wait()
        except TimeoutError:
            self.cancel()
            return False
        self.drained = not self.cancelled
        return True

    def cancel(self) -> None:
        self.cancelled = True

    def ended(self) -> bool:
        return self.ended_.is_set() or self.cancelled


def _never_opened(*_: object) -> None:
    raise AssertionError("a counted stop opens no call")


class CountedStops(Stopper):
    """Stop requests counted instead of sent; the call ends at the ``effective``-th (never if 0)."""

    def __init__(self, call: EndingCall, effective: int) -> None:
        super().__init__(_never_opened, stop_timeout_s=1.0)
        self.call = call
        self.effective = effective
        self.sent: list[str] = []

    async def _stop(self, url: str, engine_model: str, request_id: str) -> None:
        self.sent.append(request_id)
        if len(self.sent) == self.effective:
            asyncio.get_running_loop().call_later(0.05, self.call.end)


@pytest.mark.parametrize(("effective", "sent"), [(1, 1), (3, 3)])
async def test_the_stop_is_sent_until_the_call_ends(effective: int, sent: int) -> None:
    call = EndingCall()
    backend = CountedStops(call, effective)
    await backend._stop_and_drain(call, "url", "m_tensorrt_llm", "r-1")  # type: ignore[arg-type]
    assert backend.sent == ["r-1"] * sent
    assert call.drained


async def test_a_call_that_never_ends_is_closed_after_the_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call = EndingCall()
    backend = CountedStops(call, effective=0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with caplog.at_level(logging.WARNING, "adapters.triton.stopping"):
        await backend._stop_and_drain(call, "url", "m_tensorrt_llm", "r-2")  # type: ignore[arg-type]
    took = loop.time() - started
    assert call.cancelled and not call.drained
    assert took >= 2.0, took
    assert 2 <= len(backend.sent) <= 5, backend.sent
    assert "did not end within 2.0 s" in caplog.text


class FailingThenEffective(CountedStops):
    """The first stops fail (the server is busy), the third ends the call."""

    async def _stop(self, url: str, engine_model: str, request_id: str) -> None:
        await super()._stop(url, engine_model, request_id)
        if len(self.sent) < 3:
            raise RuntimeError("unavailable")


class Unanswered(CountedStops):
    """A stop that never answers."""

    async def _stop(self, url: str, engine_model: str, request_id: str) -> None:
        await super()._stop(url, engine_model, request_id)
        await asyncio.Event().wait()


async def test_a_failed_stop_is_sent_again_and_warned_of_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call = EndingCall()
    backend = FailingThenEffective(call, effective=3)
    with caplog.at_level(logging.WARNING, "adapters.triton.stopping"):
        await backend._stop_and_drain(call, "url", "m_tensorrt_llm", "r-3")  # type: ignore[arg-type]
    assert len(backend.sent) == 3 and call.drained
    assert caplog.text.count("stopping request r-3 failed") == 1


async def test_a_stop_that_never_answers_holds_nothing_past_the_budget() -> None:
    call = EndingCall()
    backend = Unanswered(call, effective=0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await backend._stop_and_drain(call, "url", "m_tensorrt_llm", "r-4")  # type: ignore[arg-type]
    assert call.cancelled and backend.sent == ["r-4"]
    assert loop.time() - started < backend.ending_s + 5.0  # unbounded: waits for good


class Finished:
    """An exchange that read its request's final response."""

    finished = True


async def test_a_call_whose_request_ended_is_read_to_its_end_not_cancelled() -> None:
    """An error's final response comes before the call's end: the call is read to its end,
    a cancellation never racing Triton's completion of it."""
    call = EndingCall()
    stopper = Stopper(_never_opened, stop_timeout_s=1.0)
    stopper.release(call, Finished(), None, "r-5", "op")  # type: ignore[arg-type]
    assert not call.cancelled
    asyncio.get_running_loop().call_later(0.05, call.end)
    await stopper.close()
    assert call.drained


async def test_a_call_read_to_its_end_is_left_alone() -> None:
    call = EndingCall()
    call.end()
    stopper = Stopper(_never_opened, stop_timeout_s=1.0)
    stopper.release(call, Finished(), None, "r-6", "op")  # type: ignore[arg-type]
    assert not stopper._background and not call.cancelled


def test_a_handoff_names_the_context_call_that_answered_it_once() -> None:
    handed_off = HandedOff(kept=2)
    handed_off.remember(b"first", "r-0-1")
    handed_off.remember(b"second", "r-1-2")
    assert handed_off.pop(b"first") == "r-0-1"
    assert handed_off.pop(b"first") is None
    # The oldest are forgotten past ``kept``: long taken, or freed by their engine's timeout.
    handed_off.remember(b"third", "r-2-3")
    handed_off.remember(b"fourth", "r-3-4")
    assert handed_off.pop(b"second") is None
    assert handed_off.pop(b"fourth") == "r-3-4"
