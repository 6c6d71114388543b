"""A split model's pools from its pipeline's sidecars: the generation sidecars are its replicas,
the context sidecars its context pool; what cannot be split is refused before anything starts."""

from __future__ import annotations

from typing import Any

import pytest

from deploy.sidecar.spec import parse_spec
from gateway.catalog.registry import resolve_routes
from gateway.ops.preflight import check_before_start
from gateway.replicas.settings import DisaggregationSettings, EndpointSettings, RoutingSettings
from gateway.replicas.sources import ReplicaAddress
from gateway.settings import (
    ModelSettings,
    ServerSettings,
    Settings,
    SettingsError,
    check_settings,
)
from gateway.tenancy import TenancySettings
from tests.support.deploy_spec import TORCH

SIDECARS = [
    {"name": "ctx", "disaggregation": {"phase": "context", "kv_transfer_timeout_ms": 5000}},
    {"name": "gen", "disaggregation": {"phase": "generation"}},
]
SPLIT_SPEC = parse_spec(
    {"models": [{"name": "tiny", "tokenizer_dir": "tok/id", "engine": TORCH}], "sidecars": SIDECARS}
)
WHOLE_SPEC = parse_spec(
    {
        "models": [{"name": "tiny", "tokenizer_dir": "tok/id", "engine": TORCH}],
        "sidecars": [{"name": "a"}, {"name": "b"}],
    }
)
URLS = {"tiny": "127.0.0.1:1"}
CONTEXT = ReplicaAddress("ctx", "127.0.0.1:1", "http://127.0.0.1:3/metrics", "http://127.0.0.1:2")
GENERATION = ReplicaAddress(
    "gen", "127.0.0.1:4", "http://127.0.0.1:6/metrics", "http://127.0.0.1:5"
)
HOSTS = {"tiny": [CONTEXT, GENERATION]}


def _model(**routing: Any) -> ModelSettings:
    return ModelSettings(
        name="tiny",
        pipeline="tiny",
        entry="tensorrt_llm",
        routing=RoutingSettings(**routing),
    )


def _settings(model: ModelSettings) -> Settings:
    # Port 0: the check of the port to listen on passes wherever the tests run.
    return Settings(
        models=(model,), server=ServerSettings(port=0), tenancy=TenancySettings(auth=False)
    )


def test_the_context_sidecars_are_the_context_pool_and_the_generation_sidecars_the_replicas() -> (
    None
):
    model = _model(disaggregation=DisaggregationSettings(min_prompt_tokens=64))
    check_settings(_settings(model))
    (route,) = resolve_routes(_settings(model), SPLIT_SPEC, URLS, sidecar_replicas=HOSTS)
    assert route.replicas == (ReplicaAddress("gen", "127.0.0.1:4", GENERATION.metrics_url),)
    assert route.target.url == "127.0.0.1:4"
    split = route.routing.disaggregation
    assert split is not None and split.min_prompt_tokens == 64
    assert split.context_replicas == (
        EndpointSettings(url="127.0.0.1:1", metrics_url=CONTEXT.metrics_url, name="ctx"),
    )


def test_a_model_on_a_split_pipeline_without_disaggregation_runs_on_the_generation_sidecars() -> (
    None
):
    (route,) = resolve_routes(_settings(_model()), SPLIT_SPEC, URLS, sidecar_replicas=HOSTS)
    assert [replica.name for replica in route.replicas or ()] == ["gen"]
    assert route.routing.disaggregation is None


@pytest.mark.parametrize(
    ("spec", "model", "message"),
    [
        (
            WHOLE_SPEC,
            _model(disaggregation=DisaggregationSettings()),
            "model 'tiny': routing.disaggregation needs context and generation sidecars, and "
            "pipeline 'tiny' runs whole on its sidecars: give them disaggregation: "
            r"\{phase: context\} and \{phase: generation\}",
        ),
        (
            SPLIT_SPEC,
            _model(disaggregation=DisaggregationSettings(context_replicas=("c:8001",))),
            r"runs on context sidecars \['ctx'\], the model's context pool: leave "
            "routing.disaggregation.context_replicas out",
        ),
    ],
)
def test_a_split_the_sidecars_cannot_serve_is_refused_before_they_start(
    spec: Any, model: ModelSettings, message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        check_before_start(_settings(model), spec)
    hosts = {"tiny": [ReplicaAddress(s.name, f"{s.name}:1") for s in spec.sidecars]}
    with pytest.raises(SettingsError, match=message):
        resolve_routes(_settings(model), spec, URLS, sidecar_replicas=hosts)


def test_a_split_model_on_a_pipeline_of_one_sidecar_is_refused() -> None:
    one = parse_spec({"models": [{"name": "tiny", "tokenizer_dir": "tok/id", "engine": TORCH}]})
    model = _model(disaggregation=DisaggregationSettings())
    with pytest.raises(SettingsError, match="runs whole on its sidecars"):
        check_before_start(_settings(model), one)
