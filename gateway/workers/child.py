"""One worker process: a whole gateway app listening on the shared port."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from deploy.sidecar.spec import Spec
from gateway.settings import Settings

CANNOT_SERVE = 3
"""A worker's exit status when its configuration can never be served (the parent gives up)."""


class WorkerPayload(msgspec.Struct, frozen=True):
    """What the parent hands each worker: the settings it serves, and the deploy spec as the
    parent read it (built-in model names resolved), so that no worker reads it again."""

    settings: Settings
    spec: Spec | None


def run_worker(payload: bytes, index: int, shared_sidecars: str | None, parent_pid: int) -> None:
    """Serve until the parent's signal drains this worker (the spawned process's target).

    A parent that dies without passing a signal on (killed outright) drains it too: the worker
    gets SIGTERM then (``PR_SET_PDEATHSIG``), and one whose parent is gone already never starts.
    """
    from deploy.sidecar.parentdeath import follow_parent

    if not follow_parent(parent_pid):
        sys.exit(f"error: worker {index}: its parent (pid {parent_pid}) is gone")
    from gateway.app import WorkerContext, create_app
    from gateway.observability import configure_logging
    from gateway.server import reuse_port_socket, run

    given = msgspec.json.decode(payload, type=WorkerPayload)
    settings = given.settings
    configure_logging(settings.log_level, settings.observability.log_format)
    context = WorkerContext(index, Path(shared_sidecars) if shared_sidecars else None)
    app = create_app(settings, worker=context, spec=given.spec)
    server = settings.server
    failure = run(app, settings, sockets=[reuse_port_socket(server.host, server.port)])
    if failure is not None:
        print(f"error: worker {index}: {failure}", file=sys.stderr, flush=True)
        sys.exit(CANNOT_SERVE)
