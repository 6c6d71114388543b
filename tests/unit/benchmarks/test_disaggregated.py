"""The disaggregated benchmark's deployment and figures: its configuration is one the gateway
starts (two sidecars, the model whole over both and split between them), each sidecar on its
GPU or both on one, and a setup's figures count only what arrived in the measured window."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.sidecar.spec import parse_spec
from gateway.catalog.registry import resolve_routes
from gateway.replicas.sources import ReplicaAddress
from gateway.settings import check_settings, parse_settings
from tests.benchmarks.disaggregated import SETUPS, gateway_config, parse_args
from tests.benchmarks.disaggregated_load import _figures
from tests.benchmarks.loadgen import Sample

PORTS = [(101, 102), (201, 202)]


@pytest.mark.parametrize(
    ("argv", "devices"),
    [(["--gpus", "2"], ["0", "1"]), (["--gpus", "1"], ["0", "0"]), (["--device", "cpu"], [])],
)
def test_the_benchmark_serves_the_model_whole_over_both_sidecars_and_split_between_them(
    argv: list[str], devices: list[str]
) -> None:
    args = parse_args(argv)
    config = gateway_config(args, Path("/models/llama"), PORTS)
    settings = parse_settings(config)
    check_settings(settings)
    spec = parse_spec(config["sidecars"]["inline"])
    assert [s.env.get("CUDA_VISIBLE_DEVICES") for s in spec.sidecars if s.env] == devices
    hosts = {"llm": [ReplicaAddress(s.name, f"127.0.0.1:{s.grpc_port}") for s in spec.sidecars]}
    routes = {r.name: r for r in resolve_routes(settings, spec, {"llm": "x"}, None, hosts)}
    whole, split = routes[SETUPS["aggregated"]], routes[SETUPS["disaggregated"]]
    assert [r.name for r in whole.replicas or ()] == ["a", "b"]
    assert whole.routing.disaggregation is None
    assert [r.name for r in split.replicas or ()] == ["b"]
    assert split.routing.disaggregation is not None
    assert split.routing.disaggregation.min_prompt_tokens == (64 + 4000) // 2


def _sample(start: float, first: float, gaps: list[float], error: str | None = None) -> Sample:
    return Sample(start=start, first=first, tokens=len(gaps) + 1, gaps=gaps, error=error)


def test_a_setups_figures_count_what_arrived_in_the_window() -> None:
    streams = [
        # tokens at 1, 3, 6 and 10: the gaps ending at 3 and 6 are in the window [2, 7]
        _sample(0.0, 1.0, [2.0, 3.0, 4.0]),
        _sample(0.0, 2.5, [1.0], error="HTTP 500"),
    ]
    longs = [_sample(2.0, 2.5, [0.25]), _sample(3.0, 3.75, [0.5]), Sample(start=4.0, error="x")]
    figures = _figures("s", streams, longs, (2.0, 7.0), (3.0, 100.0), (5.0, 180.0))
    assert figures.itl_ms == (2500.0, 3000.0)
    assert figures.stream_tokens_s == pytest.approx(2 / 5)
    assert figures.ttft_ms == (625.0, 750.0)
    assert figures.second_token_ms == (375.0, 500.0)
    assert (figures.long_done, figures.long_errors, figures.stream_errors) == (2, 1, 1)
    assert (figures.handoffs, figures.handoff_ms) == (2.0, 40.0)
    assert figures.handoff_share == pytest.approx(40.0 / 625.0)
    assert figures.first_error == "x"
