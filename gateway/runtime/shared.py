"""The sidecars' addresses and state, as the parent writes them for its workers."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol


class SidecarLike(Protocol):
    """What the parent reads of a supervised sidecar."""

    name: str
    restarts: int

    @property
    def pid(self) -> int | None: ...

    @property
    def grpc_url(self) -> str: ...

    @property
    def http_url(self) -> str: ...

    @property
    def metrics_url(self) -> str: ...

    @property
    def keeps_responses(self) -> bool: ...


@dataclass(frozen=True)
class SidecarView:
    """A sidecar another process supervises: where it answers, and how it is doing."""

    name: str
    grpc_url: str
    http_url: str
    metrics_url: str
    pid: int | None
    restarts: int
    keeps_responses: bool = False
    """Its tritonserver runs with the response keeper (``deploy.sidecar.frontend.keeper``)."""


@dataclass(frozen=True)
class SharedState:
    """Everything the workers read of the parent's sidecars."""

    sidecars: tuple[SidecarView, ...]
    ready: bool
    """Every sidecar has started once (its models loaded)."""


def write_state(path: Path, sidecars: Iterable[SidecarLike], *, ready: bool) -> None:
    """Replace the state file at once (readers never see half of it)."""
    views = [
        SidecarView(
            s.name, s.grpc_url, s.http_url, s.metrics_url, s.pid, s.restarts, s.keeps_responses
        )
        for s in sidecars
    ]
    data = {"ready": ready, "sidecars": [asdict(view) for view in views]}
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def read_state(path: Path) -> SharedState:
    """The state as last written; no sidecars yet if the file is missing."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return SharedState((), ready=False)
    views = tuple(SidecarView(**view) for view in data["sidecars"])
    return SharedState(views, ready=bool(data["ready"]))
