"""The engine's grammar compile pool: a deadline on each request's wait, a bound on compiles at
once, and a cache by content. The compiler is a stand-in that blocks until the test lets it
finish, so every ordering here is decided by the test, not by the clock."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from deploy.triton.engine.grammars import (
    CompileSlots,
    GrammarCompiles,
    GrammarReady,
    GrammarWait,
    GrammarWaits,
    compile_owner,
)
from deploy.triton.engine.types import EngineError, EngineRequest, GuideRequest

WAIT_S = 30.0
"""How long a test waits for something that happens at once unless the code is broken."""


class Compiler:
    """Compiles a guide into ``("grammar", text)`` once the test releases its text."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.entered = threading.Semaphore(0)
        self._release: dict[str | None, threading.Event] = {}
        self._lock = threading.Lock()

    def gate(self, text: str | None) -> threading.Event:
        with self._lock:
            return self._release.setdefault(text, threading.Event())

    def release(self, text: str | None) -> None:
        self.gate(text).set()

    def wait_entered(self, count: int = 1) -> None:
        for _ in range(count):
            assert self.entered.acquire(timeout=WAIT_S), "no compile started"

    def __call__(self, guide: GuideRequest) -> Any:
        with self._lock:
            self.calls.append(guide.guide or "")
        self.entered.release()
        assert self.gate(guide.guide).wait(WAIT_S)
        if guide.guide == "bad":
            raise EngineError("invalid guided_decoding_guide for guide type regex: bad")
        return ("grammar", guide.guide)


@pytest.fixture
def compiler() -> Compiler:
    return Compiler()


def pool_of(compiler: Compiler, **options: Any) -> Iterator[GrammarCompiles]:
    settings: dict[str, Any] = {"timeout_s": WAIT_S, "max_compiles": 2, "cache_bytes": 100}
    pool = GrammarCompiles(compiler, size_of=lambda _: 10, **(settings | options))
    yield pool
    for text in [*compiler.calls, "a", "b", "c", "bad"]:
        compiler.release(text)
    pool.shutdown()


@pytest.fixture
def pool(compiler: Compiler) -> Iterator[GrammarCompiles]:
    yield from pool_of(compiler)


@pytest.fixture
def hasty(compiler: Compiler) -> Iterator[GrammarCompiles]:
    """A pool whose deadline passes while the test holds a compile (tenths of a second)."""
    yield from pool_of(compiler, timeout_s=0.2, max_compiles=1)


def regex(text: str) -> GuideRequest:
    return GuideRequest("regex", text)


def test_one_guide_compiles_once_for_everyone_who_asks(
    pool: GrammarCompiles, compiler: Compiler
) -> None:
    first = pool.compile(regex("a"))
    second = pool.compile(regex("a"))
    compiler.wait_entered()
    assert not first.done() and not second.done()
    compiler.release("a")
    assert first.result(WAIT_S) == second.result(WAIT_S) == ("grammar", "a")
    cached = pool.compile(regex("a"))
    assert cached.done() and cached.result() == ("grammar", "a")
    assert compiler.calls == ["a"]
    assert pool.compiles_started == 1


def test_the_cache_is_by_content(pool: GrammarCompiles, compiler: Compiler) -> None:
    for text in ("a", "b"):
        compiler.release(text)
    assert pool.compile(regex("a")).result(WAIT_S) == ("grammar", "a")
    assert pool.compile(regex("b")).result(WAIT_S) == ("grammar", "b")
    assert pool.compile(GuideRequest("ebnf_grammar", "a")).result(WAIT_S) == ("grammar", "a")
    assert compiler.calls == ["a", "b", "a"]


def test_the_cache_keeps_the_recently_used_within_its_bytes(compiler: Compiler) -> None:
    for pool in pool_of(compiler, cache_bytes=25):
        for text in ("a", "b", "c", "a"):
            compiler.release(text)
        pool.compile(regex("a")).result(WAIT_S)
        pool.compile(regex("b")).result(WAIT_S)
        assert pool.compile(regex("a")).done()  # used again: "b" is now the oldest
        pool.compile(regex("c")).result(WAIT_S)
        assert pool.cached_bytes() == 20
        assert pool.compile(regex("a")).done()
        pool.compile(regex("b")).result(WAIT_S)
        assert compiler.calls == ["a", "b", "c", "b"]


def test_no_more_compiles_run_at_once_than_the_bound(
    pool: GrammarCompiles, compiler: Compiler
) -> None:
    futures = [pool.compile(regex(text)) for text in ("a", "b", "c")]
    compiler.wait_entered(2)
    assert sorted(compiler.calls) == ["a", "b"]
    assert not compiler.entered.acquire(timeout=0.3)  # a third would have started by now
    compiler.release("a")
    compiler.wait_entered()
    assert sorted(compiler.calls) == ["a", "b", "c"]
    compiler.release("b")
    compiler.release("c")
    assert [f.result(WAIT_S) for f in futures] == [("grammar", t) for t in ("a", "b", "c")]


def test_a_compile_past_its_deadline_fails_its_request_and_is_cached_when_done(
    hasty: GrammarCompiles, compiler: Compiler
) -> None:
    late = hasty.compile(regex("a"))
    compiler.wait_entered()
    error = late.exception(WAIT_S)
    assert isinstance(error, EngineError)
    assert "guided_decoding_guide (guide type regex) did not compile within 0.2 s" in str(error)
    assert "guided_decoding_compile_timeout_ms" in str(error)
    compiler.release("a")
    # The compile runs on, and its grammar then serves the next request at once.
    for _ in range(int(WAIT_S / 0.05)):
        if hasty.cached_bytes():
            break
        time.sleep(0.05)
    cached = hasty.compile(regex("a"))
    assert cached.done() and cached.result() == ("grammar", "a")
    assert compiler.calls == ["a"]


def test_a_grammar_ready_only_past_its_deadline_is_late_even_before_the_deadline_sweep(
    hasty: GrammarCompiles, compiler: Compiler
) -> None:
    # The sweep stopped stands for a deadline thread that runs behind on a busy host.
    hasty._deadlines.stop()
    late = hasty.compile(regex("a"))
    compiler.wait_entered()
    time.sleep(0.3)
    compiler.release("a")
    error = late.exception(WAIT_S)
    assert isinstance(error, EngineError)
    assert "guided_decoding_guide (guide type regex) did not compile within 0.2 s" in str(error)


def test_a_request_that_waited_for_a_slot_says_so_and_its_compile_never_runs(
    hasty: GrammarCompiles, compiler: Compiler
) -> None:
    hasty.compile(regex("a"))
    compiler.wait_entered()
    queued = hasty.compile(regex("b"))
    error = queued.exception(WAIT_S)
    assert isinstance(error, EngineError)
    assert "waited for one of the engine's 1 grammar compile slots" in str(error)
    compiler.release("a")
    hasty.compile(regex("c"))
    compiler.wait_entered()
    # "b" was queued before "c": nobody waited for it any more, so its slot went to "c".
    assert compiler.calls == ["a", "c"]


def test_a_bad_guide_fails_every_request_for_it_and_is_not_cached(
    pool: GrammarCompiles, compiler: Compiler
) -> None:
    compiler.release("bad")
    first = pool.compile(regex("bad"))
    with pytest.raises(EngineError, match="invalid guided_decoding_guide for guide type regex"):
        first.result(WAIT_S)
    again = pool.compile(regex("bad"))
    assert isinstance(again.exception(WAIT_S), EngineError)
    assert compiler.calls == ["bad", "bad"]


def test_waiting_requests_wake_their_engine_once_their_grammar_is_ready() -> None:
    woken: list[GrammarReady] = []
    waits = GrammarWaits[str](woken.append)
    pending: Future[Any] = Future()
    ready: Future[Any] = Future()
    ready.set_result("grammar")
    waits.hold(GrammarWait("r1", "entry 1", pending))
    waits.hold(GrammarWait("r2", "entry 2", ready))
    assert [w.request_id for w in woken] == ["r2"]
    assert waits.pop("r2") == "entry 2"
    assert waits.pop("r2") is None
    pending.set_result("grammar")
    assert [w.request_id for w in woken] == ["r2", "r1"]
    assert waits.drain() == ["entry 1"]
    assert waits.drain() == []


def test_an_owner_whose_compiles_run_on_holds_one_slot_and_the_others_keep_compiling(
    compiler: Compiler, pool: GrammarCompiles
) -> None:
    """A tenant (its ``cache_salt_id``) whose grammars compile for minutes takes one of the two
    slots; another tenant's fresh grammar compiles in the other while the first's wait."""
    hostile, quiet = 7, 8
    first = pool.compile(regex("slow-1"), hostile)
    compiler.wait_entered()
    second = pool.compile(regex("slow-2"), hostile)
    victim = pool.compile(regex("a"), quiet)
    compiler.wait_entered()
    assert compiler.calls == ["slow-1", "a"]  # not slow-2, though it asked first
    compiler.release("a")
    assert victim.result(WAIT_S) == ("grammar", "a")
    assert not first.done() and not second.done()
    compiler.release("slow-1")
    assert first.result(WAIT_S) == ("grammar", "slow-1")
    compiler.wait_entered()
    compiler.release("slow-2")
    assert second.result(WAIT_S) == ("grammar", "slow-2")


def test_compiles_of_no_owner_take_every_slot(compiler: Compiler, pool: GrammarCompiles) -> None:
    """Without salts (one tenant, or a cache its tenants share) both slots serve at once."""
    first, second = pool.compile(regex("a")), pool.compile(regex("b"))
    compiler.wait_entered(2)
    assert sorted(compiler.calls) == ["a", "b"]
    compiler.release("a")
    compiler.release("b")
    assert first.result(WAIT_S) == ("grammar", "a") and second.result(WAIT_S) == ("grammar", "b")


def test_with_two_slots_no_owner_takes_both() -> None:
    """The second slot stays for others while one owner's compile runs; another owner, or the
    same one once its compile ended, may take it."""
    slots = CompileSlots(2)
    slots.put(7, "slow-1")
    slots.put(7, "slow-2")
    assert slots.take() == (7, "slow-1")
    assert not slots.runnable()  # slow-2 waits though a slot is free
    slots.put(8, "quiet")
    assert slots.runnable() and slots.take() == (8, "quiet")
    slots.release(7)
    assert slots.take() == (7, "slow-2")
    slots.put(None, "x")
    slots.put(None, "y")
    assert slots.take() == (None, "x")
    assert slots.runnable() and slots.take() == (None, "y")  # no owner: every slot
    slots.close()
    assert slots.take() is None


def test_each_owner_compiles_and_caches_its_own_grammars(
    compiler: Compiler, pool: GrammarCompiles
) -> None:
    """No tenant learns from a compile's speed that another sent the same grammar."""
    compiler.release("a")
    assert pool.compile(regex("a"), 7).result(WAIT_S) == ("grammar", "a")
    assert pool.compile(regex("a"), 7).done()  # cached for its owner
    assert pool.compile(regex("a"), 8).result(WAIT_S) == ("grammar", "a")
    assert compiler.calls == ["a", "a"]


def test_a_requests_compile_owner_is_its_scope() -> None:
    salt = (0xABCD1234 << 32) | 0x5678
    request = EngineRequest(request_id="r", input_ids=[1], max_new_tokens=1, cache_salt_id=salt)
    assert compile_owner(request) == 0xABCD1234
    assert compile_owner(EngineRequest(request_id="r", input_ids=[1], max_new_tokens=1)) is None
