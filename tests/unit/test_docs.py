"""The documentation site builds strictly, and its configuration reference covers every field."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import msgspec
import pytest
import yaml

from deploy.sidecar.spec import Spec
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _reference() -> ModuleType:
    """The MkDocs hook that generates the reference, loaded from its file as MkDocs loads it."""
    spec = importlib.util.spec_from_file_location(
        "config_reference", ROOT / "docs" / "hooks" / "config_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    reference = (tmp_path / "site" / "reference" / "configuration" / "index.html").read_text()
    assert "<!-- reference:" not in reference
    assert "admin_key_sha256" in reference and "max_beam_width" in reference


def test_a_page_left_out_of_the_navigation_fails_the_build(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(ROOT / "docs")
    config["hooks"] = [str(ROOT / hook) for hook in config["hooks"]]
    config["nav"] = [entry for entry in config["nav"] if entry != {"Performance": "performance.md"}]
    partial = tmp_path / "mkdocs.yml"
    partial.write_text(yaml.safe_dump(config))
    built = _build(partial, tmp_path / "site")
    assert built.returncode != 0
    assert "performance.md" in built.stderr


@pytest.mark.parametrize("root", [Settings, Spec], ids=["gateway.yaml", "deploy.yaml"])
def test_every_field_has_a_description(root: type[msgspec.Struct]) -> None:
    assert _reference().undocumented(root) == []


class _Part(msgspec.Struct, frozen=True):
    """A section with one field described and one not."""

    described: int = 1
    """What it does."""
    bare: str = ""


class _Whole(msgspec.Struct, frozen=True):
    """A file holding a list of parts."""

    parts: list[_Part] = []
    """The parts."""


def test_a_field_without_a_description_is_named_and_fails_the_reference() -> None:
    reference = _reference()
    assert reference.undocumented(_Whole) == ["parts[].bare"]
    with pytest.raises(ValueError, match=r"parts\[\]\.bare"):
        reference.render(_Whole)


def test_the_reference_shows_each_field_with_its_default_and_description() -> None:
    rendered = _reference().render(Settings)
    assert "### `server`" in rendered
    assert "| `workers` | integer | `1` | Gateway processes serving the port." in rendered
    assert "### `models[].engine" not in rendered
    spec = _reference().render(Spec)
    assert "### `models[].engine (kind: torch)`" in spec
    assert "| `model_dir` | string | required |" in spec
