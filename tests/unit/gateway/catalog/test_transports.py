"""Which transport a model's requests take to Triton, the settings that contradict it, and
what the host's buffer says of Triton's HTTP frontend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploy.sidecar import frontend
from deploy.sidecar.frontend import keeper
from deploy.sidecar.spec import parse_spec
from gateway import cli
from gateway.catalog.registry import resolve_routes
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
    settings = parse_settings({"models": list(models), "tenancy": {"auth": False}})
    check_settings(settings)
    return resolve_routes(settings, SPEC, GRPC, HTTP, hosts, sidecar_http)


@pytest.mark.parametrize(
    ("transport", "sidecar_http", "over_http"),
    [
        # auto: HTTP only where this host's buffer keeps Triton's HTTP responses.
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
    (safe,) = resolve_routes(settings, SPEC, GRPC, HTTP, None, True)
    (unsafe,) = resolve_routes(settings, SPEC, GRPC, HTTP, None, False)
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
    (route,) = resolve_routes(Settings(models=(model,)), None, {}, {}, None, True)
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


def test_the_host_buffer_is_read_and_judged(tmp_path: Path) -> None:
    wmem = tmp_path / "wmem_default"
    wmem.write_text("212992\n")
    assert frontend.queue_bytes(wmem) == 212992
    assert not frontend.keeps_responses(212992)
    assert frontend.keeps_responses(8 * 1024 * 1024)
    assert not frontend.keeps_responses(None)
    assert frontend.keeps_responses(212992, keeper=True)
    assert frontend.keeps_responses(None, keeper=True)
    assert frontend.queue_bytes(tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("keep", "wmem", "transports", "said", "warned"),
    [
        ("built", "212992", ["auto"], "m0: over Triton's HTTP generate_stream (the response "
         "keeper is preloaded", False),
        ("built", "212992", ["http"], None, False),
        ("unbuilt", "212992", ["auto"], "m0: over gRPC, since the response keeper could not be "
         "built (no C compiler) and this host's net.core.wmem_default is 212992", False),
        ("off", "212992", ["auto"], "since the response keeper is off in the spec", False),
        ("off", "8388608", ["auto"], "m0: over Triton's HTTP generate_stream (this host's "
         "net.core.wmem_default is 8388608", False),
        ("off", "212992", ["http"], None, True),
        ("unbuilt", "212992", ["http"], None, True),
        ("off", "8388608", ["http"], None, False),
        # Only the sidecar's models are named, each by what it takes.
        ("off", "212992", ["http", "remote"], None, True),
        ("off", "212992", ["auto", "http"], "m0: over gRPC", True),
        ("off", "unreadable", ["auto"], "net.core.wmem_default could not be read", False),
    ],
)  # fmt: skip
def test_serve_says_which_transport_and_warns_of_an_unsafe_http(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    keep: str,
    wmem: str,
    transports: list[str],
    said: str | None,
    warned: bool,
) -> None:
    path = tmp_path / "wmem_default"
    if wmem != "unreadable":
        path.write_text(wmem)
    monkeypatch.setattr(frontend, "WMEM_DEFAULT", path)
    built = tmp_path / "keep-responses.so" if keep == "built" else None
    monkeypatch.setattr(keeper, "build", lambda folder=None: built)
    spec = {
        "models": [{"name": "tiny", "engine": {"kind": "torch", "model_dir": "/t"}}],
        "sidecars": [{"keep_responses": keep != "off"}],
    }
    models: list[dict[str, Any]] = []
    for index, transport in enumerate(transports):
        if transport == "remote":
            models.append({"name": f"m{index}", "tokenizer_dir": "/t", "triton_url": "t:8001"})
        else:
            models.append({"name": f"m{index}", "pipeline": "tiny", "transport": transport})
    settings = parse_settings({"sidecars": {"inline": spec}, "models": models})
    cli._say_transports(settings)
    out, err = capsys.readouterr()
    if said is None:
        assert "over" not in out
    else:
        assert said in out
        assert "m1" not in out
    assert ("take Triton's HTTP transport" in err) == warned
    if warned:
        assert err.split(" take ")[0].strip() == "warning: " + ", ".join(
            f"m{i}" for i, t in enumerate(transports) if t == "http"
        )
