"""One name, one meaning: no class or type alias is defined under the same name twice across
``gateway/``, ``adapters/`` and ``deploy/``, unless the two are the same type written alike."""

from __future__ import annotations

import ast
from collections import defaultdict

import pytest

from tests.support import REPO

PACKAGES = ("gateway", "adapters", "deploy")

SAME_NAME_BY_CONTRACT = {"TritonPythonModel"}
"""Names another program looks up: Triton's Python backend loads each ``model.py``'s class by
this name."""


def _is_type_name(name: str) -> bool:
    """CamelCase: a class or a type alias, not a constant (``ROUTES``) nor a type variable."""
    return len(name) > 1 and name[0].isupper() and not name.isupper()


def definitions(source: str) -> dict[str, str]:
    """The module's top-level classes and type aliases, each with what defines it: ``class`` for
    a class, the aliased type's source for an alias."""
    found: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            found[node.name] = "class"
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            if isinstance(value, ast.Call):
                continue  # TypeVar("T"), NewType and instances: not aliases
            for target in targets:
                if isinstance(target, ast.Name) and _is_type_name(target.id):
                    found[target.id] = ast.unparse(value)
    return found


def clashes(modules: dict[str, str]) -> dict[str, list[str]]:
    """Names defined in more than one module with different meanings: any class defined twice,
    an alias defined twice as different types, or a class and an alias of one name."""
    seen: dict[str, dict[str, str]] = defaultdict(dict)
    for module, source in modules.items():
        for name, definition in definitions(source).items():
            seen[name][module] = definition
    return {
        name: sorted(where)
        for name, where in seen.items()
        if len(where) > 1
        and name not in SAME_NAME_BY_CONTRACT
        and ("class" in where.values() or len(set(where.values())) > 1)
    }


def _modules() -> dict[str, str]:
    return {
        str(path.relative_to(REPO)): path.read_text(encoding="utf-8")
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    }


def test_no_name_is_defined_twice_with_different_meanings() -> None:
    modules = _modules()
    assert len(modules) > 100
    assert clashes(modules) == {}


@pytest.mark.parametrize(
    ("modules", "clashing"),
    [
        ({"a.py": "class Endpoint: ...", "b.py": "class Endpoint: ..."}, ["Endpoint"]),
        (
            {"a.py": "Opener = Callable[[str], int]", "b.py": "Opener = Callable[[], int]"},
            ["Opener"],
        ),
        ({"a.py": "class Ticket: ...", "b.py": "Ticket = int"}, ["Ticket"]),
        ({"a.py": "Chunks = list[int]", "b.py": "Chunks: TypeAlias = tuple[int]"}, ["Chunks"]),
        ({"a.py": "Array = NDArray[Any]", "b.py": "Array = NDArray[Any]"}, []),
        ({"a.py": "T = TypeVar('T')", "b.py": "T = TypeVar('T')"}, []),
        ({"a.py": "ROUTES = [a]", "b.py": "ROUTES = [b]"}, []),
        ({"a.py": "class TritonPythonModel: ...", "b.py": "class TritonPythonModel: ..."}, []),
        ({"a.py": "def f():\n    class Inner: ...", "b.py": "class Inner: ..."}, []),
    ],
)
def test_what_counts_as_a_clash(modules: dict[str, str], clashing: list[str]) -> None:
    assert sorted(clashes(modules)) == clashing
