"""Import arrows: gateway -> adapters -> tritonclient (one module), deploy stands alone."""

from __future__ import annotations

import ast
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "adapters", "deploy")
TRITONCLIENT_HOME = "adapters/triton/client.py"
FORBIDDEN = {
    "deploy": ("gateway", "adapters"),
    "adapters": ("gateway",),
    "gateway": (),
}


def modules() -> list[PurePosixPath]:
    return sorted(
        PurePosixPath(p.relative_to(ROOT).as_posix())
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
    )


def imported_modules(source: str, rel: PurePosixPath) -> set[str]:
    """Absolute names of every module a file imports, at any depth, relative ones resolved."""
    package = rel.with_suffix("").parts[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, filename=str(rel))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                names.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                names.add(node.module)
    return names


def violations(source: str, rel: PurePosixPath) -> list[str]:
    """The imports of one file that break the layering."""
    layer = rel.parts[0]
    found = []
    for name in sorted(imported_modules(source, rel)):
        top = name.split(".")[0]
        if top in FORBIDDEN[layer]:
            found.append(f"{rel} ({layer}) imports {name}")
        if top == "tritonclient" and rel.as_posix() != TRITONCLIENT_HOME:
            found.append(f"{rel} imports {name}; only {TRITONCLIENT_HOME} may")
    return found


@pytest.mark.parametrize("rel", modules(), ids=str)
def test_imports_follow_the_layers(rel: PurePosixPath) -> None:
    assert violations((ROOT / rel).read_text(), rel) == []


@pytest.mark.parametrize(
    ("source", "where", "broken"),
    [
        ("import tritonclient.grpc", "adapters/triton/tensors.py", True),
        ("import tritonclient.grpc.aio as aio", "adapters/triton/client.py", False),
        ("from tritonclient.utils import x", "gateway/app.py", True),
        ("from gateway.app import create_app", "deploy/cli.py", True),
        ("from adapters.contract import Backend", "deploy/supervisor.py", True),
        ("from adapters.contract import Backend", "gateway/app.py", False),
        ("from deploy.spec import Spec", "gateway/app.py", False),
        ("from gateway import errors", "adapters/triton/client.py", True),
        ("from ... import gateway", "adapters/triton/x.py", False),
        ("from ..contract import Backend", "deploy/engine/x.py", False),
        ("from ...adapters import contract", "deploy/engine/x.py", True),
        ("def f():\n    import gateway.cli\n", "deploy/x.py", True),
    ],
)
def test_the_scanner_sees_violations(source: str, where: str, broken: bool) -> None:
    assert bool(violations(source, PurePosixPath(where))) is broken
