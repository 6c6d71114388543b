"""The pure rules of routing over replicas: scores, bounded load, affinity memory and
health."""

from __future__ import annotations

import pytest

from gateway.replicas.affinity import AdapterIndex, PrefixIndex, block_hashes
from gateway.replicas.health import Health, stalled
from gateway.replicas.policy import Candidate, Request, choose, scores, within_bound
from gateway.replicas.settings import ScoreWeights

W = ScoreWeights()
ONLY_QUEUE = ScoreWeights(kv_cache=0, prefix=0, adapter=0)


def c(name: str, in_flight: int = 0, **fields: object) -> Candidate:
    return Candidate(name, in_flight, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("policy", "candidates", "request_", "turn", "chosen"),
    [
        # Equal load: ties go round in turn.
        ("score", [c("a"), c("b"), c("c")], Request(), 0, "a"),
        ("score", [c("a"), c("b"), c("c")], Request(), 1, "b"),
        ("score", [c("a"), c("b"), c("c")], Request(), 5, "c"),
        # The least loaded wins; scraped waiting requests count as load.
        ("score", [c("a", 3), c("b", 1), c("c", 2)], Request(), 0, "b"),
        ("score", [c("a", 1), c("b", 1, waiting=4.0), c("c", 2)], Request(), 0, "a"),
        # A fuller KV cache loses at equal queues.
        ("score", [c("a", kv_fraction=0.9), c("b", kv_fraction=0.1)], Request(), 0, "b"),
        # Prefix affinity beats one request more in flight...
        ("score", [c("a", 2, prefix_blocks=4), c("b", 1)], Request(prompt_blocks=4), 0, "a"),
        # ...a deeper match beats a shallower one...
        (
            "score",
            [c("a", prefix_blocks=1), c("b", prefix_blocks=3)],
            Request(prompt_blocks=4),
            0,
            "b",
        ),
        # ...but not the bounded load: 9 in flight against 0 and 0 is over 1.5 x the mean and
        # more than 8 (the default slack) over the least loaded.
        ("score", [c("a", 9, prefix_blocks=4), c("b"), c("c")], Request(prompt_blocks=4), 0, "b"),
        # Adapter affinity: the holder, then a replica with room, then the rest.
        (
            "score",
            [c("a", 1), c("b", 2, holds_adapter=True), c("c", 1)],
            Request(adapter=True),
            0,
            "b",
        ),
        (
            "score",
            [c("a", 1), c("b", 1, adapter_room=True), c("c", 1)],
            Request(adapter=True),
            0,
            "b",
        ),
        # A base-model request ignores adapters held.
        ("score", [c("a", 1, holds_adapter=True), c("b", 0)], Request(), 0, "b"),
        # least_request: fewest in flight, scraped waiting and affinity ignored.
        ("least_request", [c("a", 2), c("b", 1, waiting=9.0), c("c", 3)], Request(), 0, "b"),
        (
            "least_request",
            [c("a", 2, prefix_blocks=4), c("b", 1)],
            Request(prompt_blocks=4),
            0,
            "b",
        ),
        ("least_request", [c("a", 1), c("b", 1)], Request(), 1, "b"),
        # round_robin: whatever the load.
        ("round_robin", [c("a", 9), c("b", 0), c("c", 0)], Request(), 3, "a"),
        ("round_robin", [c("a", 9), c("b", 0), c("c", 0)], Request(), 4, "b"),
    ],
)
def test_choose(
    policy: str, candidates: list[Candidate], request_: Request, turn: int, chosen: str
) -> None:
    index = choose(
        policy,  # type: ignore[arg-type]
        candidates,
        request_,
        weights=W,
        load_factor=1.5,
        load_slack=8,
        turn=turn,
    )
    assert candidates[index].name == chosen


@pytest.mark.parametrize(
    ("loads", "factor", "slack", "expected"),
    [
        ([0, 0, 0], 1.5, 0, [True, True, True]),
        ([3, 0, 0], 1.5, 0, [False, True, True]),  # cap ceil(1.5 * 4 / 3) = 2
        ([2, 2, 2], 1.5, 0, [True, True, True]),  # cap ceil(1.5 * 7 / 3) = 4
        ([3, 3, 0], 1.0, 0, [False, False, True]),  # cap ceil(7 / 3) = 3
        ([3, 2, 1], 1.0, 0, [False, True, True]),
        ([4, 2, 2], 1.25, 0, [False, True, True]),  # cap ceil(1.25 * 9 / 3) = 4
        ([3, 0, 0], 1.5, 3, [True, True, True]),  # 3 over the least loaded: within the slack
        ([9, 5, 4], 1.0, 4, [False, True, True]),  # cap 7; 5 over the least loaded
    ],
)
def test_bounded_load(loads: list[int], factor: float, slack: int, expected: list[bool]) -> None:
    candidates = [c(str(i), load) for i, load in enumerate(loads)]
    assert within_bound(candidates, factor, slack) == expected


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        (c("idle"), 2.0 + 2.0),
        (c("busy", 3), 2.0 * (1 - 3 / 4) + 2.0),
        (c("full", kv_fraction=1.0), 2.0),
        (c("bad metric", kv_fraction=7.0), 2.0),
    ],
)
def test_score_terms(candidate: Candidate, expected: float) -> None:
    (score,) = scores([candidate, c("busiest", 3)], Request(), W, 1.5)[:1]
    assert score == pytest.approx(expected)


def test_weights_of_zero_leave_only_the_queue() -> None:
    values = scores(
        [c("a", 1, prefix_blocks=4, kv_fraction=0.9), c("b", 1)],
        Request(prompt_blocks=4),
        ONLY_QUEUE,
        1.5,
    )
    assert values[0] == values[1]


@pytest.mark.parametrize(
    ("ids", "block", "most", "count"),
    [
        (range(10), 4, 100, 2),
        (range(8), 4, 100, 2),
        (range(3), 4, 100, 0),
        (range(1000), 64, 5, 5),
        ((), 64, 5, 0),
    ],
)
def test_block_hashes_cover_full_leading_blocks(
    ids: range, block: int, most: int, count: int
) -> None:
    assert len(block_hashes(list(ids), block, most)) == count


def test_block_hashes_chain_the_prefix() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, 10)
    b = block_hashes([1, 2, 3, 4, 5, 6, 7, 9], 4, 10)
    c_ = block_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4, 10)
    assert a[0] == b[0] and a[1] != b[1]
    assert a[1] != c_[1]  # the same second block after a different first one
    assert block_hashes([1, 2, 3, 4], 2, 10)[0] != block_hashes([1, 2, 3, 4], 4, 10)[0]


@pytest.mark.parametrize(
    ("routed", "prompt", "expected"),
    [
        ([], [1, 2, 3], {}),
        ([([1, 2, 3], "a")], [1, 2, 3], {"a": 3}),
        ([([1, 2, 3], "a")], [1, 2, 9], {"a": 2}),
        ([([1, 2, 3], "a")], [9, 2, 3], {}),
        # The first replica keeps what it owns; the other owns what was new.
        ([([1, 2], "a"), ([1, 2, 3, 4], "b")], [1, 2, 3, 4], {"a": 2, "b": 4}),
        ([([1, 2, 3, 4], "a"), ([1, 2, 3, 4], "b")], [1, 2, 3, 4], {"a": 4}),
    ],
)
def test_prefix_ownership(
    routed: list[tuple[list[int], str]], prompt: list[int], expected: dict[str, int]
) -> None:
    index = PrefixIndex(capacity=100)
    for hashes, replica in routed:
        index.record(hashes, replica)
    assert index.matches(prompt) == expected


def test_prefix_index_forgets_least_recently_used_and_by_replica() -> None:
    index = PrefixIndex(capacity=3)
    index.record([1, 2], "a")
    index.record([7], "b")
    index.record([1], "a")  # touched: 2 is now the oldest
    index.record([8], "b")
    assert len(index) == 3
    assert index.matches([1, 2]) == {"a": 1}
    index.forget("a")
    assert index.matches([1]) == {}
    assert index.matches([8]) == {"b": 1}


def test_adapter_ownership_slots_and_spills() -> None:
    index = AdapterIndex(slots=2)
    index.record("x", "a")
    index.record("y", "a")
    assert (index.owner("x"), index.has_room("a"), index.has_room("b")) == ("a", False, True)
    index.record("x", "b")  # a spill does not move the owner
    assert index.owner("x") == "a"
    index.record("x", "a")  # touched
    index.record("z", "a")  # evicts y, the least recently used
    assert (index.owner("y"), index.owner("z")) == (None, "a")
    index.forget("a")
    assert (index.owner("x"), index.has_room("a")) == (None, True)


def run(health: Health, steps: list[tuple[float, str]]) -> list[str]:
    states = []
    for now, event in steps:
        if event == "ok":
            health.probed(True, now)
        elif event == "not ready":
            health.probed(False, now)
        elif event == "late":
            health.probed(False, now, timed_out=True)
        else:
            health.failed("unavailable", now)
        states.append(health.state)
    return states


@pytest.mark.parametrize(
    ("steps", "states"),
    [
        # Pending until a probe finds it ready; a not-ready pending replica stays pending.
        ([(0, "not ready"), (1, "ok")], ["pending", "up"]),
        # Ejected on a failure; a probe before the time out changes nothing; after it, it is back.
        ([(0, "ok"), (1, "fail"), (1.5, "ok"), (2.0, "ok")], ["up", "ejected", "ejected", "up"]),
        # A failed half-open probe doubles the time out: 1 s, then 2 s.
        (
            [(0, "ok"), (1, "fail"), (2, "not ready"), (3.5, "ok"), (4, "ok")],
            ["up", "ejected", "ejected", "ejected", "up"],
        ),
        # A ready replica whose probe fails is ejected.
        ([(0, "ok"), (1, "not ready")], ["up", "ejected"]),
        # Probes that time out eject only the third in a row; an answer in between resets them.
        (
            [(0, "ok"), (1, "late"), (2, "late"), (3, "ok"), (4, "late"), (5, "late")],
            ["up", "up", "up", "up", "up", "up"],
        ),
        ([(0, "ok"), (1, "late"), (2, "late"), (3, "late")], ["up", "up", "up", "ejected"]),
        # A late half-open probe keeps an ejected replica out at once.
        (
            [(0, "ok"), (1, "fail"), (2, "late"), (3, "ok"), (4.1, "ok")],
            ["up", "ejected", "ejected", "ejected", "up"],
        ),
    ],
)
def test_health_transitions(steps: list[tuple[float, str]], states: list[str]) -> None:
    assert run(Health(eject_s=1.0, max_eject_s=8.0, probe_misses=3), steps) == states


def test_health_time_out_doubles_up_to_the_most_and_resets() -> None:
    health = Health(eject_s=1.0, max_eject_s=4.0)
    health.probed(True, 0)
    health.failed("unavailable", 0)
    outs = []
    now = 0.0
    for _ in range(4):
        now = health.until
        health.probed(False, now)
        outs.append(health.until - now)
    assert outs == [2.0, 4.0, 4.0, 4.0]
    health.probed(True, health.until)
    assert health.state == "up" and health.next_eject_s == 1.0
    assert health.ejections == {"unavailable": 1}


@pytest.mark.parametrize(
    ("in_flight", "last", "now", "expected"),
    [(0, 0.0, 100.0, False), (1, 0.0, 5.0, False), (1, 0.0, 10.0, True), (3, 50.0, 55.0, False)],
)
def test_stalled(in_flight: int, last: float, now: float, expected: bool) -> None:
    assert stalled(in_flight, last, now, 10.0) is expected
