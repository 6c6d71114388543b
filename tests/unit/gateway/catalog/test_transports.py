"""Which transport a model's requests take to Triton, decided at start and why, the sidecars
that run the response keeper, and the settings that contradict a transport."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploy.sidecar.frontend import keeper
from deploy.sidecar.spec import parse_spec
from gateway.catalog.registry import resolve_routes, triton_endpoints
from gateway.catalog.transports import (
    build_keepers,
    choose_transports,
    keeper_sidecars,
    log_choices,
)
from gateway.observability.metrics import GatewayMetrics
from gateway.replicas.settings import RoutingSettings
from gateway.replicas.sources import ReplicaAddress
from gateway.settings import ModelSettings, Settings, SettingsError, check_settings, parse_settings

SPEC = parse_spec(
    {
        "models": [{"name": "tiny", "engine": {"kind": "torch", "model_dir": "/m/tiny"}}],
        "sidecars": [{"name": "a"}, {"name": "b"}],
    }
)
GRPC = {"tiny": "127.0.0.1:23001"}
HTTP = {"tiny": "http://127.0.0.1:23000"}


def _routes(*models: dict[str, Any], hosts: Any = None, sidecar_http: bool = False) -> Any:
    """The routes where both sidecars run the response keeper (``sidecar_http``), or neither."""
    settings = parse_settings({"models": list(models), "tenancy": {"auth": False}})
    check_settings(settings)
    choices = choose_transports(settings, SPEC, {"a", "b"} if sidecar_http else ())
    over_http = {choice.model for choice in choices if choice.transport == "http"}
    return resolve_routes(settings, SPEC, GRPC, HTTP, hosts, over_http)


@pytest.mark.parametrize(
    ("transport", "sidecar_http", "over_http"),
    [
        # auto: HTTP only where the sidecars run the response keeper.
        ("auto", False, False),
        ("auto", True, True),
        ("grpc", True, False),
        ("http", False, True),
    ],
)
def test_a_sidecar_model_takes_http_when_asked_or_where_it_is_safe(
    transport: str, sidecar_http: bool, over_http: bool
) -> None:
    model = {"name": "m", "pipeline": "tiny", "transport": transport}
    (route,) = _routes(model, sidecar_http=sidecar_http)
    assert route.target.url == GRPC["tiny"]
    assert route.target.http_url == (HTTP["tiny"] if over_http else None)


def test_every_pipeline_served_by_default_follows_auto() -> None:
    settings = parse_settings({"tenancy": {"auth": False}})
    (kept,) = choose_transports(settings, SPEC, {"a", "b"})
    (bare,) = choose_transports(settings, SPEC, {"a"})
    assert (kept.model, kept.transport, bare.transport) == ("tiny", "http", "grpc")
    (safe,) = resolve_routes(settings, SPEC, GRPC, HTTP, None, {"tiny"})
    (unsafe,) = resolve_routes(settings, SPEC, GRPC, HTTP, None, ())
    assert (safe.target.http_url, unsafe.target.http_url) == (HTTP["tiny"], None)


def test_sidecar_replicas_keep_their_http_addresses_only_for_http() -> None:
    hosts = {
        "tiny": [
            ReplicaAddress("a", "h:1", None, "http://h:2"),
            ReplicaAddress("b", "k:1", None, "http://k:2"),
        ]
    }
    (plain,) = _routes({"name": "m", "pipeline": "tiny"}, hosts=hosts)
    assert [e.http_url for e in plain.replicas] == [None, None]
    assert plain.target.http_url is None
    (safe,) = _routes({"name": "m", "pipeline": "tiny"}, hosts=hosts, sidecar_http=True)
    assert [e.http_url for e in safe.replicas] == ["http://h:2", "http://k:2"]
    (http,) = _routes({"name": "m", "pipeline": "tiny", "transport": "http"}, hosts=hosts)
    assert [e.http_url for e in http.replicas] == ["http://h:2", "http://k:2"]
    assert http.target.http_url == "http://h:2"


def test_a_remote_model_left_to_auto_goes_over_grpc_even_where_sidecars_take_http() -> None:
    (route,) = _routes({"name": "m", "tokenizer_dir": "/t", "triton_url": "t:8001"},
                       sidecar_http=True)  # fmt: skip
    assert route.target.http_url is None


def test_a_remote_model_over_http_takes_its_given_address() -> None:
    (route,) = _routes({"name": "m", "tokenizer_dir": "/t", "triton_url": "t:8001",
                        "triton_http_url": "http://t:8000", "transport": "http"})  # fmt: skip
    assert (route.target.url, route.target.http_url) == ("t:8001", "http://t:8000")


def test_dns_replicas_over_http_take_the_http_port() -> None:
    (route,) = _routes({"name": "m", "tokenizer_dir": "/t", "replicas": "dns:triton:8001",
                        "routing": {"http_port": 8000}, "transport": "http"})  # fmt: skip
    assert route.replicas.http_port == 8000


def test_dns_replicas_not_over_http_keep_no_http_port() -> None:
    # Unchecked settings (resolve_routes alone) still give a gRPC model no HTTP address.
    model = ModelSettings(name="m", tokenizer_dir="/t", replicas="dns:triton:8001",
                          routing=RoutingSettings(http_port=0), transport="grpc")  # fmt: skip
    (route,) = resolve_routes(Settings(models=(model,)), None, {}, {}, None, ())
    assert route.replicas.http_port is None


def test_a_triton_http_url_on_a_pipeline_of_several_sidecars_is_refused() -> None:
    hosts = {
        "tiny": [
            ReplicaAddress("a", "h:1", None, "http://h:2"),
            ReplicaAddress("b", "k:1", None, "http://k:2"),
        ]
    }
    model = {"name": "m", "pipeline": "tiny", "transport": "http", "triton_http_url": "http://x:1"}
    with pytest.raises(SettingsError, match="runs on several sidecars"):
        _routes(model, hosts=hosts)


@pytest.mark.parametrize(
    ("model", "match"),
    [
        # An HTTP address on a gRPC model would be ignored: said, not ignored.
        ({"triton_url": "t:8001", "triton_http_url": "http://t:8000"},
         "triton_http_url is used only with transport: http"),
        ({"triton_url": "t:8001", "triton_http_url": "http://t:8000", "transport": "grpc"},
         "triton_http_url is used only with transport: http"),
        ({"replicas": ["a:8001"], "routing": {"http_port": 8000}},
         "routing.http_port is used only with transport: http"),
        ({"replicas": [{"url": "a:8001", "http_url": "http://a:8000"}]},
         "http_url of replica a:8001 is used only with transport: http"),
        # An HTTP model needs an address for every Triton it reaches.
        ({"transport": "http", "triton_url": "t:8001"}, "transport: http needs triton_http_url"),
        ({"transport": "http"}, "transport: http needs triton_http_url"),
        ({"transport": "http", "replicas": "dns:triton:8001"},
         "needs routing.http_port .* for dns:triton:8001"),
        ({"transport": "http", "replicas": [{"url": "a:8001", "http_url": "http://a:8000"},
                                            "b:8001"]},
         "needs routing.http_port .* for b:8001"),
        ({"transport": "udp"}, "invalid settings"),
        # A port of 0 is still given; an empty address is none.
        ({"replicas": ["a:8001"], "routing": {"http_port": 0}},
         "routing.http_port is used only with transport: http"),
        ({"transport": "http", "triton_url": "t:8001", "triton_http_url": ""},
         "an empty HTTP address"),
        ({"transport": "http", "replicas": [{"url": "a:8001", "http_url": ""}],
          "routing": {"http_port": 8000}}, "an empty HTTP address"),
        # One HTTP address for several Tritons would be ignored for theirs.
        ({"transport": "http", "replicas": ["a:8001"], "triton_http_url": "http://a:8000",
          "routing": {"http_port": 8000}}, "triton_http_url names one Triton"),
    ],
)  # fmt: skip
def test_transport_contradictions_are_refused(model: dict[str, Any], match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        _routes({"name": "m", "tokenizer_dir": "/t", **model})


def _spec(keep: bool = True) -> Any:
    engine = {"kind": "torch", "model_dir": "/m/tiny"}
    return parse_spec(
        {
            "models": [{"name": "p1", "engine": engine}, {"name": "p2", "engine": engine}],
            "sidecars": [
                {"name": "a", "models": ["p1"]},
                {"name": "b", "models": ["p2"], "keep_responses": keep},
            ],
        }
    )


@pytest.mark.parametrize(
    ("model", "keep", "kept", "transport", "reason", "warn"),
    [
        ({"transport": "auto"}, True, {"b"}, "http", "keeper", False),
        ({"transport": "auto"}, True, set(), "grpc", "keeper_unbuilt", False),
        ({"transport": "auto"}, False, set(), "grpc", "keeper_off", False),
        ({"transport": "grpc"}, True, {"b"}, "grpc", "settings", False),
        ({"transport": "http"}, True, {"b"}, "http", "settings", False),
        # Asked for without the keeper: taken, and said loudly.
        ({"transport": "http"}, False, set(), "http", "keeper_off", True),
        ({"transport": "http"}, True, set(), "http", "keeper_unbuilt", True),
        # A Triton the gateway does not start: auto is gRPC, http the operator's word.
        ({"triton_url": "t:8001", "tokenizer_dir": "/t"}, True, {"b"}, "grpc",
         "not_supervised", False),
        ({"triton_url": "t:8001", "tokenizer_dir": "/t", "transport": "http",
          "triton_http_url": "http://t:8000"}, True, {"b"}, "http", "settings", False),
    ],
)  # fmt: skip
def test_each_model_takes_one_transport_for_a_reason(
    model: dict[str, Any], keep: bool, kept: set[str], transport: str, reason: str, warn: bool
) -> None:
    settings = parse_settings({"models": [{"name": "m", "pipeline": "p2", **model}]})
    (choice,) = choose_transports(settings, _spec(keep), kept)
    assert (choice.model, choice.transport, choice.reason, choice.warn) == (
        "m",
        transport,
        reason,
        warn,
    )


@pytest.mark.parametrize(
    ("transports", "keep", "wanted"),
    [
        # A sidecar reached only over gRPC never loads the keeper.
        (("grpc", "auto"), True, {"b"}),
        (("auto", "grpc"), True, {"a"}),
        (("grpc", "grpc"), True, set()),
        (("http", "auto"), True, {"a", "b"}),
        # Switched off in the spec: never loaded.
        (("grpc", "http"), False, set()),
    ],
)
def test_the_keeper_goes_only_where_a_model_may_take_http(
    monkeypatch: pytest.MonkeyPatch, transports: tuple[str, str], keep: bool, wanted: set[str]
) -> None:
    models = [
        {"name": f"m{i}", "pipeline": f"p{i + 1}", "transport": t} for i, t in enumerate(transports)
    ]
    settings = parse_settings({"models": models})
    spec = _spec(keep)
    assert keeper_sidecars(settings, spec) == wanted
    builds: list[None] = []
    library = Path("/cache/keep-responses.so")

    def build(folder: Path | None = None) -> Path:
        builds.append(None)
        return library

    monkeypatch.setattr(keeper, "build", build)
    keepers = build_keepers(settings, spec)
    assert keepers == {name: library if name in wanted else None for name in ("a", "b")}
    # Built once for every sidecar that runs it, and not at all where none does.
    assert len(builds) == (1 if wanted else 0)


def test_the_start_up_log_names_each_models_transport_and_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = parse_settings(
        {"models": [{"name": "fast", "pipeline": "p2"}, {"name": "risky", "pipeline": "p2",
                                                         "transport": "http"}]}
    )  # fmt: skip
    with caplog.at_level("INFO", logger="gateway.catalog.transports"):
        log_choices(choose_transports(settings, _spec(False), ()))
    lines = {(r.levelname, r.getMessage()) for r in caplog.records}
    assert lines == {
        ("INFO", "model fast reaches Triton over grpc: keep_responses: false on sidecar b"),
        ("WARNING", "model risky reaches Triton over http: transport: http in its settings, and "
         "keep_responses: false on sidecar b: responses may be lost"),
    }  # fmt: skip


def test_metrics_name_each_endpoints_transport() -> None:
    hosts = {
        "tiny": [
            ReplicaAddress("a", "h:1", None, "http://h:2"),
            ReplicaAddress("b", "k:1", None, "http://k:2"),
        ]
    }
    (replicated,) = _routes({"name": "m", "pipeline": "tiny"}, hosts=hosts, sidecar_http=True)
    assert triton_endpoints(replicated) == ["http://h:2", "http://k:2"]
    (plain,) = _routes({"name": "m", "pipeline": "tiny"})
    assert triton_endpoints(plain) == [GRPC["tiny"]]
    metrics = GatewayMetrics()
    metrics.record_transports([("m", "http://h:2", "http", "keeper"),
                               ("g", GRPC["tiny"], "grpc", "settings")])  # fmt: skip
    text = metrics.render().decode()
    assert (
        'gateway_triton_transport_info{endpoint="http://h:2",model="m",reason="keeper",'
        'transport="http"} 1.0'
    ) in text
    assert f'endpoint="{GRPC["tiny"]}",model="g",reason="settings",transport="grpc"' in text
