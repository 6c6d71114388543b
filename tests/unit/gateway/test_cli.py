"""The ``triton-gateway`` command line: arguments, configuration errors, delegation to deploy."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.cli import DEMO_MODEL, DEMO_SPLIT_TOKENS, build_parser, demo_settings, main


def test_serve_needs_a_config() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve"])
    args = build_parser().parse_args(["serve", "--config", "g.yaml", "--port", "23001"])
    assert (args.config, args.port, args.host) == ("g.yaml", 23001, None)


def test_demo_defaults() -> None:
    args = build_parser().parse_args(["demo"])
    assert (args.host, args.port, args.disaggregated) == ("127.0.0.1", 8000, False)
    assert DEMO_MODEL == "smollm2"


def test_the_disaggregated_demo_splits_its_model_over_a_context_and_a_generation_sidecar(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deploy.sidecar.models
    from gateway.catalog.registry import resolve_routes
    from gateway.ops.preflight import check_before_start
    from gateway.replicas.sources import ReplicaAddress
    from gateway.runtime.spec import parse_sidecar_spec

    monkeypatch.setattr(deploy.sidecar.models, "ensure_smollm2", lambda: tiny_model_dir)
    assert build_parser().parse_args(["demo", "--disaggregated"]).disaggregated
    settings = demo_settings("127.0.0.1", 0, disaggregated=True)
    assert settings.sidecars is not None
    spec = parse_sidecar_spec(settings.sidecars)
    check_before_start(settings, spec)
    hosts = {DEMO_MODEL: [ReplicaAddress(s.name, f"{s.name}:8001") for s in spec.sidecars]}
    (route,) = resolve_routes(settings, spec, {DEMO_MODEL: "context:8001"}, None, hosts)
    assert [replica.name for replica in route.replicas or ()] == ["generation"]
    split = route.routing.disaggregation
    assert split is not None and split.min_prompt_tokens == DEMO_SPLIT_TOKENS
    assert [getattr(pool, "name", None) for pool in split.context_replicas] == ["context"]


@pytest.mark.parametrize("content", [None, "models: [{name: x, nope: 1}]\n", "models: [\n"])
def test_bad_configuration_exits_with_2(
    tmp_path: Path, content: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gateway.yaml"
    if content is not None:
        config.write_text(content)
    assert main(["serve", "--config", str(config)]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_deploy_is_delegated(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec = tmp_path / "deploy.yaml"
    spec.write_text(
        f"models: [{{name: tiny, engine: {{kind: torch, model_dir: {tiny_model_dir}}}}}]\n"
    )
    assert main(["deploy", "render", str(spec), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "main" / "tiny_ensemble" / "config.pbtxt").is_file()


def test_serve_reads_the_deploy_spec_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks before start, the transports said and the app's start all take the spec
    ``serve`` read; the app's start is stood in for by the spec it is given."""
    from deploy.sidecar.frontend import keeper
    from gateway import app, server
    from tests.unit.gateway.test_app import closed_port

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "deploy.yaml").write_text(
        "models: [{name: tiny, engine: {kind: torch, model_dir: ./model}}]\n"
    )
    (tmp_path / "gateway.yaml").write_text(
        f"sidecars: {{spec: ./deploy.yaml}}\nserver: {{port: {closed_port()}}}\n"
        "tenancy: {auth: false}\n"
    )
    deploy = tmp_path / "deploy.yaml"
    reads: list[Path] = []
    started_with: list[object] = []
    read_text = Path.read_text

    def counted(path: Path, *args: Any, **kwargs: Any) -> str:
        if path == deploy:
            reads.append(path)
        return read_text(path, *args, **kwargs)

    def create_app(settings: object, **options: object) -> object:
        started_with.append(options.get("spec"))
        return SimpleNamespace(state={"runtime": None})

    monkeypatch.setattr(Path, "read_text", counted)
    monkeypatch.setattr(keeper, "build", lambda folder=None: None)
    monkeypatch.setattr(app, "create_app", create_app)
    monkeypatch.setattr(server, "run", lambda *args, **kwargs: None)
    assert main(["serve", "--config", str(tmp_path / "gateway.yaml")]) == 0
    assert reads == [deploy]
    assert started_with and started_with[0] is not None
