"""The pure parts of routing over replicas: scores, affinity memory, health, Triton's signals,
replica sources and their settings."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from deploy.sidecar.spec import parse_spec
from gateway.catalog.registry import resolve_routes
from gateway.replicas.affinity import AdapterIndex, PrefixIndex, block_hashes
from gateway.replicas.health import Health, stalled
from gateway.replicas.policy import Candidate, Request, choose, scores, within_bound
from gateway.replicas.settings import EndpointSettings, RoutingSettings, ScoreWeights
from gateway.replicas.signals import EngineSignals, parse_signals
from gateway.replicas.sources import (
    DnsName,
    Endpoint,
    SourceError,
    parse_source,
    resolve_addresses,
)
from gateway.settings import ModelSettings, Settings, SettingsError, check_settings
from gateway.tenancy import TenancySettings

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
    ],
)
def test_health_transitions(steps: list[tuple[float, str]], states: list[str]) -> None:
    assert run(Health(eject_s=1.0, max_eject_s=8.0), steps) == states


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


TINY = 'model="tiny_tensorrt_llm",version="1"'
BIG = 'model="big_tensorrt_llm",version="1"'
METRICS = "\n".join(
    [
        "# HELP nv_trt_llm_request_metrics TRT LLM request metrics",
        "# TYPE nv_trt_llm_request_metrics gauge",
        f'nv_trt_llm_request_metrics{{{TINY},request_type="waiting"}} 3',
        f'nv_trt_llm_request_metrics{{{TINY},request_type="scheduled"}} 8',
        f'nv_trt_llm_request_metrics{{{TINY},request_type="max"}} 16',
        f'nv_trt_llm_request_metrics{{{BIG},request_type="waiting"}} 5',
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="fraction",{TINY}}} 0.25',
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="tokens_per",{TINY}}} 32',
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="fraction",{BIG}}} 0.5',
        'nv_inference_request_success{model="tiny_ensemble",version="1"} 12',
        "",
    ]
)


@pytest.mark.parametrize(
    ("text", "model", "expected"),
    [
        (METRICS, "tiny_tensorrt_llm", EngineSignals(3.0, 8.0, 0.25, 32)),
        (METRICS, "big_tensorrt_llm", EngineSignals(5.0, 0.0, 0.5, None)),
        (METRICS, None, EngineSignals(8.0, 8.0, 0.5, 32)),
        (METRICS, "other", None),
        ('nv_inference_request_success{model="x"} 1\n', None, None),
        (
            'nv_trt_llm_request_metrics{model="m",request_type="waiting"} NaN-ish\n'
            'nv_trt_llm_request_metrics{model="m",request_type="scheduled"} 2\n',
            "m",
            EngineSignals(0.0, 2.0, 0.0, None),
        ),
    ],
)
def test_parse_signals(text: str, model: str | None, expected: EngineSignals | None) -> None:
    assert parse_signals(text, model) == expected


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        (
            ("10.0.0.5:8001", EndpointSettings(url="h:9", metrics_url="http://h:1/m", name="n")),
            (
                Endpoint("10.0.0.5:8001", "10.0.0.5:8001", "http://10.0.0.5:8002/metrics"),
                Endpoint("n", "h:9", "http://h:1/m"),
            ),
        ),
        ("dns:triton.ns.svc:8001", DnsName("triton.ns.svc", 8001, 8002)),
        ("dns:///triton:9001", DnsName("triton", 9001, 8002)),
    ],
)
def test_parse_source(replicas: object, expected: object) -> None:
    assert parse_source(replicas, 8002) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("replicas", "match"),
    [
        ("triton:8001", "dns:HOST:PORT"),
        ("dns:triton", "not host:port"),
        (("a:1", "a:1"), "twice"),
        (("a",), "not host:port"),
    ],
)
def test_bad_sources(replicas: object, match: str) -> None:
    with pytest.raises(SourceError, match=match):
        parse_source(replicas, 8002)  # type: ignore[arg-type]


def test_dns_endpoints_bracket_ipv6() -> None:
    name = DnsName("t", 8001, 8002)
    assert name.endpoints(["fd00::2", "10.0.0.1", "10.0.0.1"]) == (
        Endpoint("10.0.0.1:8001", "10.0.0.1:8001", "http://10.0.0.1:8002/metrics"),
        Endpoint("[fd00::2]:8001", "[fd00::2]:8001", "http://[fd00::2]:8002/metrics"),
    )


def test_the_system_resolver_answers() -> None:
    assert "127.0.0.1" in asyncio.run(resolve_addresses("localhost", 8001))


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (
            {"name": "m", "triton_url": "h:1", "replicas": ["a:1", "b:1"]},
            "triton_url .* or replicas",
        ),
        ({"name": "m", "replicas": ["a:1"], "routing": {"load_factor": 0.5}}, "load_factor"),
        ({"name": "m", "routing": {"max_in_flight": 0}}, "max_in_flight must be >= 1"),
        ({"name": "m", "routing": {"eject_s": 5, "max_eject_s": 1}}, "max_eject_s"),
        ({"name": "m", "routing": {"weights": {"prefix": -1}}}, "weights.prefix"),
    ],
)
def test_routing_settings_are_checked(model: dict[str, object], match: str) -> None:
    settings = Settings(models=(msgspec.convert(model, ModelSettings),))
    with pytest.raises(SettingsError, match=match):
        check_settings(settings)


def test_routing_defaults_pass() -> None:
    model = ModelSettings(replicas="dns:t:1", routing=RoutingSettings())
    check_settings(Settings(models=(model,), tenancy=TenancySettings(auth=False)))


SIDECAR_SPEC = parse_spec(
    {
        "models": [
            {"name": "tiny", "engine": {"kind": "torch", "model_dir": "/m/tiny"}},
            {"name": "big", "engine": {"kind": "torch", "model_dir": "/m/big"}},
        ],
        "sidecars": [
            {"name": "gpu0", "models": ["tiny", "big"]},
            {"name": "gpu1", "models": ["tiny"]},
        ],
    }
)
HOSTS = {
    "tiny": [
        Endpoint("gpu0", "127.0.0.1:1", "http://127.0.0.1:3/metrics"),
        Endpoint("gpu1", "127.0.0.1:4", "http://127.0.0.1:6/metrics"),
    ]
}


@pytest.mark.parametrize(
    ("model", "url", "replicas"),
    [
        # A pipeline on two sidecars has both as replicas; on one, it keeps its one address.
        (ModelSettings(name="t", pipeline="tiny"), "127.0.0.1:1", tuple(HOSTS["tiny"])),
        (ModelSettings(name="b", pipeline="big"), "127.0.0.1:1", None),
        # A Triton named in the settings wins over the sidecars.
        (ModelSettings(name="t", pipeline="tiny", triton_url="h:9"), "h:9", None),
        (
            ModelSettings(name="t", tokenizer_dir="/t", replicas=("a:1", "b:1")),
            "a:1",
            (
                Endpoint("a:1", "a:1", "http://a:8002/metrics"),
                Endpoint("b:1", "b:1", "http://b:8002/metrics"),
            ),
        ),
        (
            ModelSettings(name="t", tokenizer_dir="/t", replicas="dns:triton:8001"),
            "dns:triton:8001",
            DnsName("triton", 8001, 8002),
        ),
    ],
)
def test_routes_with_replicas(model: ModelSettings, url: str, replicas: object) -> None:
    urls = {"tiny": "127.0.0.1:1", "big": "127.0.0.1:1"}
    (route,) = resolve_routes(Settings(models=(model,)), SIDECAR_SPEC, urls, HOSTS)
    assert (route.target.url, route.replicas) == (url, replicas)


def test_bad_replicas_name_the_model() -> None:
    model = ModelSettings(name="t", tokenizer_dir="/t", replicas="triton:8001")
    with pytest.raises(SettingsError, match=r"model 't': replicas: .*dns:HOST:PORT"):
        resolve_routes(Settings(models=(model,)), None, {})
