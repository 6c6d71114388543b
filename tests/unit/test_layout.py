"""``tests/unit/`` mirrors the code: each of its folders is a folder of the code it tests, and
only the tests of the whole tree sit at its top."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import REPO

UNIT = REPO / "tests" / "unit"

WHOLE_TREE = {
    "test_architecture.py",
    "test_cache_scopes.py",
    "test_docs.py",
    "test_layout.py",
    "test_names.py",
}
"""Tests of the import arrows, the names, the documentation, this layout, and a feature checked
across the layers."""

MIRRORED_FROM = {"benchmarks": REPO / "tests", "support": REPO / "tests"}
"""Test folders of the tests' own code: ``tests/benchmarks/`` and ``tests/support/``."""


def unmirrored(unit: Path, repo: Path, mirrored_from: dict[str, Path]) -> list[str]:
    """Test folders under ``unit`` whose code folder does not exist, and folders that are no
    packages (two test modules of one name would then clash)."""
    found = []
    for folder in sorted(p for p in unit.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        relative = folder.relative_to(unit)
        if not (folder / "__init__.py").is_file():
            found.append(f"{relative}: no __init__.py")
        if not (mirrored_from.get(relative.parts[0], repo) / relative).is_dir():
            found.append(f"{relative}: no such code folder")
    return found


def test_every_unit_test_folder_mirrors_a_code_folder() -> None:
    assert unmirrored(UNIT, REPO, MIRRORED_FROM) == []


def test_only_the_tests_of_the_whole_tree_sit_at_the_top() -> None:
    assert {p.name for p in UNIT.glob("test_*.py")} == WHOLE_TREE


@pytest.mark.parametrize(
    ("code", "tests", "found"),
    [
        (["gateway/core"], ["gateway/core"], []),
        (
            [],
            ["gateway/core"],
            ["gateway: no such code folder", "gateway/core: no such code folder"],
        ),
        (["gateway/core"], ["gateway/kore"], ["gateway/kore: no such code folder"]),
    ],
)
def test_what_counts_as_unmirrored(
    tmp_path: Path, code: list[str], tests: list[str], found: list[str]
) -> None:
    for folder in code:
        (tmp_path / "repo" / folder).mkdir(parents=True)
    for folder in tests:
        path = tmp_path / "unit" / folder
        path.mkdir(parents=True)
        for package in (path, path.parent):
            (package / "__init__.py").touch()
    assert unmirrored(tmp_path / "unit", tmp_path / "repo", {}) == found
