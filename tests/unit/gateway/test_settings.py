"""Settings load from one YAML file and resolve against the sidecars' deploy spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar

from deploy.sidecar.spec import parse_spec
from gateway.catalog.registry import resolve_routes
from gateway.server import uvicorn_config
from gateway.settings import (
    ModelSettings,
    Settings,
    SettingsError,
    check_settings,
    load_settings,
    parse_settings,
)

SPEC = parse_spec(
    {
        "models": [
            {
                "name": "tiny",
                "engine": {"kind": "torch", "model_dir": "/m/tiny", "max_seq_len": 1024},
                "add_special_tokens": False,
            },
            {"name": "big", "engine": {"kind": "torch", "model_dir": "/m/big"}},
        ],
        "sidecars": [{"name": "a", "models": ["tiny"]}, {"name": "b", "models": ["big"]}],
    }
)
URLS = {"tiny": "127.0.0.1:23001", "big": "127.0.0.1:23002"}


def test_defaults_need_no_file() -> None:
    settings = parse_settings(None)
    assert settings == Settings()
    assert settings.limits.request_timeout_s > 0
    assert settings.models == ()


def test_load_yaml_with_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "gateway.yaml").write_text(
        """
models:
  - name: chat
    triton_url: localhost:8001
    triton_model: llama_tensorrt_llm_bls
    entry: tensorrt_llm_bls
    tokenizer_dir: ./tokenizer
    chat_template: templates/chat.jinja
    context_length: 8192
    defaults: {temperature: 0.2}
limits: {max_body_bytes: 1000, request_timeout_s: 30}
sidecars: {spec: deploy.yaml}
"""
    )
    settings = load_settings(tmp_path / "gateway.yaml")
    model = settings.models[0]
    assert model.tokenizer_dir == str(tmp_path / "tokenizer")
    assert model.chat_template == str(tmp_path / "templates" / "chat.jinja")
    assert model.defaults.temperature == 0.2
    assert settings.limits.max_body_bytes == 1000
    assert settings.sidecars is not None
    assert settings.sidecars.spec == str(tmp_path / "deploy.yaml")


@pytest.mark.parametrize(
    "data",
    [
        {"modles": []},
        {"models": [{"name": "x", "temprature": 1}]},
        {"limits": {"max_body_bytes": "big"}},
        {"limits": {"max_body_bytes": 0}},
        {"models": [{"entry": "preprocessing"}]},
    ],
)
def test_invalid_settings_are_rejected(data: dict[str, Any]) -> None:
    with pytest.raises(SettingsError):
        parse_settings(data)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="not found"):
        load_settings(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (
            ModelSettings(name="t", pipeline="tiny"),
            (
                "127.0.0.1:23001",
                "tiny_ensemble",
                "ensemble",
                "tiny_tensorrt_llm",
                "/m/tiny",
                1024,
                False,
            ),
        ),
        (
            ModelSettings(name="t", pipeline="big", entry="tensorrt_llm_bls", context_length=64),
            (
                "127.0.0.1:23002",
                "big_tensorrt_llm_bls",
                "tensorrt_llm_bls",
                "big_tensorrt_llm",
                "/m/big",
                64,
                True,
            ),
        ),
        (
            ModelSettings(
                name="t",
                pipeline="tiny",
                triton_url="h:1",
                tokenizer_dir="/tok",
                add_special_tokens=True,
            ),
            ("h:1", "tiny_ensemble", "ensemble", "tiny_tensorrt_llm", "/tok", 1024, True),
        ),
        (
            ModelSettings(name="t", triton_model="x_ensemble", tokenizer_dir="/tok"),
            ("127.0.0.1:8001", "x_ensemble", "ensemble", None, "/tok", None, True),
        ),
        (
            ModelSettings(
                name="t", triton_model="custom", engine_model="eng", tokenizer_dir="/tok"
            ),
            ("127.0.0.1:8001", "custom", "ensemble", "eng", "/tok", None, True),
        ),
    ],
)
def test_resolve_routes(model: ModelSettings, expected: tuple[object, ...]) -> None:
    (route,) = resolve_routes(Settings(models=(model,)), SPEC, URLS)
    target = route.target
    assert (
        target.url,
        target.triton_model,
        target.kind,
        target.engine_model,
        route.tokenizer_dir,
        route.context_length,
        route.add_special_tokens,
    ) == expected


@pytest.mark.parametrize(
    ("model", "counts"),
    [
        (ModelSettings(name="t", pipeline="tiny"), True),
        (ModelSettings(name="t", pipeline="tiny", entry="tensorrt_llm_bls"), True),
        (ModelSettings(name="t", pipeline="tiny", add_special_tokens=False), False),
        (ModelSettings(name="t", pipeline="tiny", tokenizer_dir="/tok"), False),
        (ModelSettings(name="t", pipeline="tiny", triton_url="h:1"), False),
        (ModelSettings(name="t", triton_model="x_ensemble", tokenizer_dir="/tok"), False),
        (
            ModelSettings(
                name="t", triton_model="x_ensemble", tokenizer_dir="/tok", count_prompts=True
            ),
            True,
        ),
        (ModelSettings(name="t", pipeline="tiny", count_prompts=False), False),
    ],
)
def test_prompts_are_counted_by_the_gateway_only_where_it_tokenizes_as_the_pipeline(
    model: ModelSettings, counts: bool
) -> None:
    """A sidecar's pipeline reads the gateway's tokenizer with its settings; anything else is
    counted by the engine unless the operator says the two tokenize alike."""
    (route,) = resolve_routes(Settings(models=(model,)), SPEC, URLS)
    assert route.counts_prompts is counts


def test_every_pipeline_is_served_when_no_model_is_listed() -> None:
    routes = resolve_routes(Settings(), SPEC, URLS)
    assert [(r.name, r.target.triton_model) for r in routes] == [
        ("tiny", "tiny_ensemble"),
        ("big", "big_ensemble"),
    ]


@pytest.mark.parametrize(
    ("models", "match"),
    [
        (
            (
                ModelSettings(name="a", tokenizer_dir="/t"),
                ModelSettings(name="a", tokenizer_dir="/t"),
            ),
            "twice",
        ),
        ((ModelSettings(name="a", pipeline="nope"),), "no pipeline"),
        ((ModelSettings(name="a"),), "tokenizer_dir"),
    ],
)
def test_unresolvable_models(models: tuple[ModelSettings, ...], match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        resolve_routes(Settings(models=models), SPEC, URLS)


def test_pipeline_without_sidecars() -> None:
    with pytest.raises(SettingsError, match="no sidecars"):
        resolve_routes(Settings(models=(ModelSettings(pipeline="tiny"),)), None, {})


def test_uvicorn_keeps_idle_connections_longer_than_the_clients_do() -> None:
    app = Litestar([])
    assert uvicorn_config(app, Settings()).timeout_keep_alive == 75
    configured = parse_settings({"server": {"keep_alive_s": 9}})
    assert uvicorn_config(app, configured).timeout_keep_alive == 9
    with pytest.raises(SettingsError, match="keep_alive_s"):
        parse_settings({"server": {"keep_alive_s": 0}})


def test_the_server_keeps_the_front_doors_limits_of_the_settings() -> None:
    from gateway.http.door import Door, DoorLimits

    app = Litestar([])
    door = uvicorn_config(app, Settings()).http
    assert isinstance(door, Door) and door.limits == DoorLimits()
    server = {"max_head_bytes": 2048, "head_timeout_s": 1.5, "body_timeout_s": 4.0,
              "max_connections": 10, "max_connections_per_peer": 3}  # fmt: skip
    door = uvicorn_config(app, parse_settings({"server": server})).http
    assert isinstance(door, Door)
    assert door.limits == DoorLimits(**server, retry_after_s=5)
    for name, value in [("max_head_bytes", 100), ("head_timeout_s", 0), ("max_connections", 0)]:
        with pytest.raises(SettingsError, match=name):
            parse_settings({"server": {name: value}})


def test_connections_to_triton_are_kept_alive_as_long_as_the_limit_says() -> None:
    from adapters.triton.client import TritonBackend
    from gateway.app import create_app

    assert Settings().limits.triton_keep_alive_s == 30
    for seconds in (0, 7.5):
        settings = parse_settings(
            {"limits": {"triton_keep_alive_s": seconds}, "tenancy": {"auth": False}}
        )
        runtime = create_app(settings).state.runtime
        backend = runtime._backend_factory(())
        assert isinstance(backend, TritonBackend)
        assert backend._http._keep_alive_s == seconds
    with pytest.raises(SettingsError, match="triton_keep_alive_s"):
        parse_settings({"limits": {"triton_keep_alive_s": -1}})


def test_the_open_files_limit_is_raised_and_a_cap_beyond_it_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import resource

    from gateway.server import SPARE_FILES, raise_open_files_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 1024:
        pytest.skip("needs a finite hard limit of open files above 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        raise_open_files_limit(hard - SPARE_FILES)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(hard, 1 << 20)
        assert "max_connections" not in caplog.text
        raise_open_files_limit(hard)
        assert f"server.max_connections is {hard}" in caplog.text
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


SPLIT_MODEL = {
    "name": "m",
    "tokenizer_dir": "/t",
    "entry": "tensorrt_llm",
    "replicas": ["g:8001"],
    "routing": {"disaggregation": {"context_replicas": ["c:8001"], "min_prompt_tokens": 256}},
}


def test_a_model_may_split_its_requests_between_two_pools() -> None:
    (model,) = parse_settings({"models": [SPLIT_MODEL]}).models
    split = model.routing.disaggregation
    assert split is not None and split.min_prompt_tokens == 256
    assert split.context_replicas == ("c:8001",)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"entry": "ensemble"}, "needs entry tensorrt_llm"),
        ({"replicas": []}, "needs replicas: the generation pool"),
        ({"routing": {"disaggregation": {}}}, "context_replicas names no replica"),
        (
            {"routing": {"disaggregation": {"context_replicas": ["c:1"], "min_prompt_tokens": -1}}},
            "min_prompt_tokens must be >= 0",
        ),
    ],
)
def test_a_split_the_model_cannot_serve_is_refused(change: dict[str, Any], match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        check_settings(
            parse_settings({"models": [{**SPLIT_MODEL, **change}], "tenancy": {"auth": False}})
        )
