"""What a model's replicas are and what they report (pure): Triton's load signals, replica
sources, routing settings and the routes that name them."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from deploy.sidecar.spec import parse_spec
from gateway.catalog.registry import resolve_routes
from gateway.replicas.settings import EndpointSettings, RoutingSettings
from gateway.replicas.signals import EngineSignals, parse_signals
from gateway.replicas.sources import (
    DnsName,
    ReplicaAddress,
    SourceError,
    parse_source,
    resolve_addresses,
)
from gateway.settings import ModelSettings, Settings, SettingsError, check_settings
from gateway.tenancy import TenancySettings

TINY = 'model="tiny_tensorrt_llm",version="1"'
BIG = 'model="big_tensorrt_llm",version="1"'
DISAGG = "nv_trt_llm_disaggregated_serving_metrics"
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
        f'{DISAGG}{{disaggregated_serving_type="request_count",{BIG}}} 7',
        f'{DISAGG}{{{BIG},disaggregated_serving_type="kv_cache_transfer_ms"}} 41.5',
        'nv_inference_request_success{model="tiny_ensemble",version="1"} 12',
        "",
    ]
)


@pytest.mark.parametrize(
    ("text", "model", "expected"),
    [
        (METRICS, "tiny_tensorrt_llm", EngineSignals(3.0, 8.0, 0.25, 32)),
        (METRICS, "big_tensorrt_llm", EngineSignals(5.0, 0.0, 0.5, None, 7.0, 41.5)),
        (METRICS, None, EngineSignals(8.0, 8.0, 0.5, 32, 7.0, 41.5)),
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
                ReplicaAddress("10.0.0.5:8001", "10.0.0.5:8001", "http://10.0.0.5:8002/metrics"),
                ReplicaAddress("n", "h:9", "http://h:1/m"),
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
        ReplicaAddress("10.0.0.1:8001", "10.0.0.1:8001", "http://10.0.0.1:8002/metrics"),
        ReplicaAddress("[fd00::2]:8001", "[fd00::2]:8001", "http://[fd00::2]:8002/metrics"),
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
        ({"name": "m", "routing": {"probe_misses": 0}}, "probe_misses must be >= 1"),
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
        ReplicaAddress("gpu0", "127.0.0.1:1", "http://127.0.0.1:3/metrics"),
        ReplicaAddress("gpu1", "127.0.0.1:4", "http://127.0.0.1:6/metrics"),
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
                ReplicaAddress("a:1", "a:1", "http://a:8002/metrics"),
                ReplicaAddress("b:1", "b:1", "http://b:8002/metrics"),
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
    (route,) = resolve_routes(Settings(models=(model,)), SIDECAR_SPEC, urls, sidecar_replicas=HOSTS)
    assert (route.target.url, route.replicas) == (url, replicas)


@pytest.mark.parametrize(
    ("replicas", "routing", "expected"),
    [
        (("a:8001", "b:8001"), RoutingSettings(http_port=8000), ("http://a:8000", "http://b:8000")),
        (
            (EndpointSettings(url="a:8001", http_url="http://a:9000"), "b:8001"),
            RoutingSettings(http_port=8000),
            ("http://a:9000", "http://b:8000"),
        ),
    ],
)
def test_replicas_of_an_http_model_take_their_http_addresses(
    replicas: tuple[str | EndpointSettings, ...],
    routing: RoutingSettings,
    expected: tuple[str | None, ...],
) -> None:
    model = ModelSettings(
        name="t", tokenizer_dir="/t", replicas=replicas, routing=routing, transport="http"
    )
    (route,) = resolve_routes(Settings(models=(model,)), None, {})
    assert isinstance(route.replicas, tuple)
    assert tuple(endpoint.http_url for endpoint in route.replicas) == expected
    # The route's own target is the first replica's, both addresses alike.
    assert route.target.http_url == expected[0]


def test_dns_replicas_take_http_where_its_port_is_known() -> None:
    name = DnsName("triton", 8001, 8002, http_port=8000)
    (endpoint,) = name.endpoints(["10.0.0.7"])
    assert endpoint.http_url == "http://10.0.0.7:8000"
    assert DnsName("triton", 8001, 8002).endpoints(["10.0.0.7"])[0].http_url is None


def test_bad_replicas_name_the_model() -> None:
    model = ModelSettings(name="t", tokenizer_dir="/t", replicas="triton:8001")
    with pytest.raises(SettingsError, match=r"model 't': replicas: .*dns:HOST:PORT"):
        resolve_routes(Settings(models=(model,)), None, {})
