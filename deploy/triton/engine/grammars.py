"""Grammars compiled beside the engine: a bounded pool of compile threads, a deadline for each
request's wait, and a cache of compiled grammars by owner and content.

A deep JSON schema takes xgrammar seconds to compile (a 300-deep one about 7 s on two cores).
Compiled in ``Engine.submit`` it held up every request behind it; here a request waits for its
grammar outside the batch while the engine keeps stepping. xgrammar releases the GIL while it
compiles (a Python thread kept running at about half its pace beside a 2.9 s compile, its
longest pause 15 ms), so threads suffice. A thread cannot be stopped: a compile outlives the
requests that gave up on it and keeps its slot until it ends, which is what bounds the CPU that
runaway grammars take; its grammar is cached for the next request that asks.

Slots are shared fairly between the requests' owners: the upper 32 bits of their
``cache_salt_id``, which the gateway derives from the tenant's KV-cache scope alone. A free slot
goes to the owner with the fewest compiles running, and with two slots or more no owner holds
all of them. A tenant that sends grammars which compile for minutes within the gateway's bounds
so holds one slot, and the other tenants' grammars keep compiling in the rest.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar

from deploy.triton.engine.types import EngineError, EngineRequest, GuidedConfig, GuideRequest

logger = logging.getLogger(__name__)

COMPILE_NICENESS = 10
"""The compile threads' nice value: on a busy CPU the engine's steps come first. Two clients
sending fresh 300-deep schemas to the tiny model on two shared cores
(``python -m tests.benchmarks.hostile.grammar``) took a quiet 14 ms p50 chat to 58-69 ms with
compiles at the engine's priority, 32-38 ms at nice 10 or 19."""
GuideKey = tuple[int | None, str, str | None]
"""A compile's owner and its guide's content (type and text): each owner's grammars are cached
and compiled apart, so no tenant learns from a compile's speed which grammars another sent, nor
waits behind another's queue for a grammar they share."""
Entry = TypeVar("Entry")


OWNER_SHIFT = 32
"""A ``cache_salt_id``'s upper bits name its scope; a client's own salt changes the lower."""


def compile_owner(request: EngineRequest) -> int | None:
    """Whose share of the compile slots a request's grammar takes: its KV-cache scope."""
    salt = request.cache_salt_id
    return None if salt is None else salt >> OWNER_SHIFT


def late_message(guide: GuideRequest, timeout_s: float, *, started: bool, slots: int) -> str:
    """What the client reads when its grammar was not ready in time."""
    if started:
        return (
            f"guided_decoding_guide (guide type {guide.guide_type}) did not compile within "
            f"{timeout_s:g} s, the limit guided_decoding_compile_timeout_ms sets: send a smaller "
            "or shallower grammar"
        )
    return (
        f"guided_decoding_guide (guide type {guide.guide_type}) waited for one of the engine's "
        f"{slots} grammar compile slots and did not compile within {timeout_s:g} s, the limit "
        "guided_decoding_compile_timeout_ms sets: the compile slots were busy"
    )


@dataclass(eq=False)
class _Compile:
    """One guide's compile, shared by every request that asks for it while it runs."""

    guide: GuideRequest
    owner: int | None
    waiters: list[tuple[Future[Any], float]] = field(default_factory=list)
    """Each request's future of the grammar, with its deadline (``time.monotonic``)."""
    started: bool = False


class GrammarCompiles:
    """Compiles guides with ``compile_guide`` on at most ``max_compiles`` threads at once.

    ``compile`` returns at once a future of the compiled grammar: done already where the cache
    holds it, else done when the shared compile ends, or failed with an ``EngineError`` once
    ``timeout_s`` has passed since the request asked. ``cache_bytes`` bounds the cache by the
    grammars' ``size_of``; the least recently used grammar goes first.
    """

    def __init__(
        self,
        compile_guide: Callable[[GuideRequest], Any],
        *,
        timeout_s: float,
        max_compiles: int,
        cache_bytes: int,
        size_of: Callable[[Any], int] = lambda grammar: int(grammar.memory_size_bytes),
    ) -> None:
        self._compile_guide = compile_guide
        self.timeout_s = timeout_s
        self.max_compiles = max_compiles
        self._cache_bytes = cache_bytes
        self._size_of = size_of
        self._lock = threading.Lock()
        self._cache: OrderedDict[GuideKey, tuple[Any, int]] = OrderedDict()
        self._cached_bytes = 0
        self._running: dict[GuideKey, _Compile] = {}
        self._slots = CompileSlots(max_compiles)
        # Daemon threads, not a ThreadPoolExecutor, whose workers the interpreter joins at exit:
        # a runaway compile must not hold up the model's unload.
        self._workers = [
            threading.Thread(target=self._work, name=f"grammar-compile-{n}", daemon=True)
            for n in range(max_compiles)
        ]
        for worker in self._workers:
            worker.start()
        self._deadlines = _Deadlines(self._expire)
        self.compiles_started = 0
        """Compiles begun (a cached or shared grammar begins none)."""

    @classmethod
    def of(cls, compile_guide: Callable[[GuideRequest], Any], config: GuidedConfig | None) -> Self:
        """A pool with the settings of ``config`` (the defaults where None)."""
        settings = config or GuidedConfig()
        return cls(
            compile_guide,
            timeout_s=settings.compile_timeout_ms / 1000.0,
            max_compiles=settings.max_compiles,
            cache_bytes=settings.cache_mb << 20,
        )

    def compile(self, guide: GuideRequest, owner: int | None = None) -> Future[Any]:
        """The compiled grammar of ``guide``, when it is ready; ``owner`` (the request's
        ``cache_salt_id``) is whose share of the compile slots a new compile takes."""
        key: GuideKey = (owner, guide.guide_type, guide.guide)
        waiter: Future[Any] = Future()
        deadline = time.monotonic() + self.timeout_s
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                waiter.set_result(hit[0])
                return waiter
            job = self._running.get(key)
            if job is None:
                job = self._running[key] = _Compile(guide, owner)
                self._slots.put(owner, (key, job))
            job.waiters.append((waiter, deadline))
        self._deadlines.add(deadline, (key, waiter))
        return waiter

    def cached_bytes(self) -> int:
        """Bytes of compiled grammars the cache holds."""
        with self._lock:
            return self._cached_bytes

    def shutdown(self) -> None:
        """Stop the deadline thread and the compile threads (each after its compile, if any)."""
        self._deadlines.stop()
        self._slots.close()

    def _work(self) -> None:
        # Linux gives each thread its own nice value, and threads xgrammar starts inherit it.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICENESS)
        while (taken := self._slots.take()) is not None:
            owner, item = taken
            try:
                self._run(*item)
            except Exception:
                logger.exception("grammar compile failed")
            finally:
                self._slots.release(owner)

    def _run(self, key: GuideKey, job: _Compile) -> None:
        with self._lock:
            if all(waiter.done() for waiter, _ in job.waiters):
                # Everyone who asked gave up while it queued: its slot goes to the next guide.
                del self._running[key]
                return
            job.started = True
            self.compiles_started += 1
        grammar, error = None, None
        try:
            grammar = self._compile_guide(job.guide)
        except Exception as exc:
            error = str(exc)
        with self._lock:
            del self._running[key]
            if grammar is not None:
                self._store(key, grammar)
        # Resolved outside the lock: the waiters' callbacks run here. A request whose deadline
        # passed before its grammar was ready is late, whether or not the deadline thread,
        # which may run behind on a busy host, has failed it yet.
        now = time.monotonic()
        late = late_message(job.guide, self.timeout_s, started=True, slots=self.max_compiles)
        for waiter, deadline in job.waiters:
            if error is not None:
                _fail(waiter, error)
            elif deadline <= now:
                if _fail(waiter, late):
                    logger.warning("a %s grammar missed its compile deadline", job.guide.guide_type)
            else:
                _resolve(waiter, grammar)

    def _store(self, key: GuideKey, grammar: Any) -> None:
        size = self._size_of(grammar)
        if size > self._cache_bytes:
            return
        self._cache[key] = (grammar, size)
        self._cached_bytes += size
        while self._cached_bytes > self._cache_bytes:
            _, (_, dropped) = self._cache.popitem(last=False)
            self._cached_bytes -= dropped

    def _expire(self, item: tuple[GuideKey, Future[Any]]) -> None:
        key, waiter = item
        if waiter.done():
            return
        with self._lock:
            job = self._running.get(key)
        started = job is not None and job.started
        guide = GuideRequest(key[1], key[2])
        if _fail(
            waiter, late_message(guide, self.timeout_s, started=started, slots=self.max_compiles)
        ):
            logger.warning("a %s grammar missed its compile deadline", guide.guide_type)


class CompileSlots:
    """The compiles waiting for a slot, by owner: ``take`` gives a free slot the oldest compile
    of the owner with the fewest running (the owners' turns rotate among equals), and no owner
    holds more than ``slots - 1`` at once where there are two slots or more. Compiles of no
    owner (no ``cache_salt_id``: one tenant, or a cache its tenants share) may take every slot."""

    def __init__(self, slots: int) -> None:
        self._slots = slots
        self._cap = max(1, slots - 1)
        self._waiting: OrderedDict[int | None, deque[Any]] = OrderedDict()
        self._running: Counter[int | None] = Counter()
        self._ready = threading.Condition()
        self._closed = False

    def put(self, owner: int | None, item: Any) -> None:
        with self._ready:
            self._waiting.setdefault(owner, deque()).append(item)
            self._ready.notify()

    def take(self) -> tuple[int | None, Any] | None:
        """The next compile and its owner, once one may run; None once closed."""
        with self._ready:
            while not self._closed and not self.runnable():
                self._ready.wait()
            if self._closed:
                return None
            owner = self._next()
            items = self._waiting[owner]
            item = items.popleft()
            del self._waiting[owner]  # its turn taken: back of the line
            if items:
                self._waiting[owner] = items
            self._running[owner] += 1
            return owner, item

    def runnable(self) -> bool:
        """Whether a waiting compile may take a free slot now (a slot being free aside)."""
        return self._next() is not _NOBODY

    def release(self, owner: int | None) -> None:
        with self._ready:
            self._running[owner] -= 1
            if not self._running[owner]:
                del self._running[owner]
            self._ready.notify_all()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def _next(self) -> Any:
        eligible = [
            owner
            for owner in self._waiting
            if self._running[owner] < (self._slots if owner is None else self._cap)
        ]
        if not eligible:
            return _NOBODY
        return min(eligible, key=lambda owner: self._running[owner])


_NOBODY = object()


def _resolve(waiter: Future[Any], grammar: Any) -> None:
    with contextlib.suppress(InvalidStateError):
        waiter.set_result(grammar)


def _fail(waiter: Future[Any], message: str) -> bool:
    """Fail ``waiter`` with ``message``; False when it was done already."""
    try:
        waiter.set_exception(EngineError(message))
    except InvalidStateError:
        return False
    return True


class _Deadlines:
    """Calls ``expire(item)`` for each item once its deadline passes, on one thread."""

    def __init__(self, expire: Callable[[Any], None]) -> None:
        self._expire = expire
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="grammar-deadlines", daemon=True)
        self._thread.start()

    def add(self, deadline: float, item: Any) -> None:
        with self._wake:
            heapq.heappush(self._heap, (deadline, next(self._order), item))
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._wake.wait(wait)
                if self._stopped:
                    return
                _, _, item = heapq.heappop(self._heap)
            try:
                self._expire(item)
            except Exception:
                logger.exception("grammar deadline handling failed")


@dataclass(frozen=True)
class GrammarWait(Generic[Entry]):
    """A guided request on its way to the engine thread, with its grammar to come."""

    request_id: str
    entry: Entry
    grammar: Future[Any]


@dataclass(frozen=True)
class GrammarReady:
    """A request's grammar is ready, or failed: the message that wakes the engine thread."""

    request_id: str
    grammar: Future[Any]


class GrammarWaits(Generic[Entry]):
    """The requests waiting outside the batch for their grammars; used on the engine thread,
    which ``wake`` (its inbox) tells when a grammar is ready."""

    def __init__(self, wake: Callable[[GrammarReady], None]) -> None:
        self._wake = wake
        self._entries: dict[str, Entry] = {}

    def hold(self, wait: GrammarWait[Entry]) -> None:
        """Keep ``wait``'s request until its grammar is ready (at once where it is already)."""
        self._entries[wait.request_id] = wait.entry
        request_id = wait.request_id
        wait.grammar.add_done_callback(
            lambda grammar: self._wake(GrammarReady(request_id, grammar))
        )

    def pop(self, request_id: str) -> Entry | None:
        """The waiting request of ``request_id``, no longer waiting; None where none waits."""
        return self._entries.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._entries)

    def drain(self) -> list[Entry]:
        """Every waiting request, none left."""
        entries = list(self._entries.values())
        self._entries.clear()
        return entries
