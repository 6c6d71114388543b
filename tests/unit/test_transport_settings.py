"""Which transport a model's requests take to Triton, the settings that contradict it, and
what the host's buffer says of Triton's HTTP frontend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploy.sidecar import frontend
from deploy.sidecar.spec import parse_spec
from gateway import cli
from gateway.catalog.registry import resolve_routes
from gateway.replicas.sources import Endpoint
from gateway.settings import SettingsError, check_settings, parse_settings

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
        "tiny": [Endpoint("a", "h:1", None, "http://h:2"), Endpoint("b", "k:1", None, "http://k:2")]
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
    (plain,) = _routes({"name": "m", "tokenizer_dir": "/t", "replicas": "dns:triton:8001"})
    assert plain.replicas.http_port is None


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
    assert frontend.queue_bytes(tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("wmem", "transport", "said", "warned"),
    [
        ("212992", "auto", "sidecar models stream over gRPC (HTTP, cheaper, once", False),
        ("8388608", "auto", "sidecar models stream over Triton's HTTP generate_stream", False),
        ("212992", "http", "", True),
        ("8388608", "http", "", False),
    ],
)
def test_serve_says_which_transport_and_warns_of_an_unsafe_http(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    wmem: str,
    transport: str,
    said: str,
    warned: bool,
) -> None:
    path = tmp_path / "wmem_default"
    path.write_text(wmem)
    monkeypatch.setattr(frontend, "WMEM_DEFAULT", path)
    settings = parse_settings(
        {"sidecars": {"spec": str(tmp_path / "deploy.yaml")},
         "models": [{"name": "m", "pipeline": "tiny", "transport": transport}]}
    )  # fmt: skip
    cli._say_transports(settings)
    out, err = capsys.readouterr()
    assert said in out
    assert ("net.core.wmem_default is 212992 bytes" in err) == warned
