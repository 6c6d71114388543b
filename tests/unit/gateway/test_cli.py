"""The ``triton-gateway`` command line: arguments, configuration errors, delegation to deploy."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import DEMO_MODEL, build_parser, main


def test_serve_needs_a_config() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve"])
    args = build_parser().parse_args(["serve", "--config", "g.yaml", "--port", "23001"])
    assert (args.config, args.port, args.host) == ("g.yaml", 23001, None)


def test_demo_defaults() -> None:
    args = build_parser().parse_args(["demo"])
    assert (args.host, args.port) == ("127.0.0.1", 8000)
    assert DEMO_MODEL == "smollm2"


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
