"""Marks of the engine's side for ``tests.benchmarks.marks_report``: in a Triton Python-backend
stub, when each request reached the engine model and when its first response went out.

``sitecustomize`` installs it in the stubs when ``FIRST_TOKEN_MARKS`` names a folder: each stub
appends a JSON line per request to ``engine-<pid>.jsonl`` there, keyed by Triton's request id
(the gateway's, which its own marks record as ``triton_id``), in the host's monotonic
nanoseconds as the gateway's marks are. The engine model's module is patched once imported, by
its name, so a renamed method fails loudly.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
import threading
import time
from types import ModuleType
from typing import Any

MODULE = "deploy.triton.engine.triton_model"


def install(folder: str) -> None:
    """Patch the engine model when its module is imported."""
    sys.meta_path.insert(0, _AfterImport(folder))


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, folder: str) -> None:
        self.folder = folder

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = spec.loader if spec is not None else None
        if loader is None:
            return spec
        execute = loader.exec_module
        folder = self.folder

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _patch(module, folder)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _patch(module: Any, folder: str) -> None:
    import json
    import os

    now = time.monotonic_ns
    out = open(f"{folder}/engine-{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115
    lock = threading.Lock()
    accepted: dict[str, int] = {}
    model = module.TritonPythonModel
    pending = module._Pending
    accept = model._accept

    @functools.wraps(accept)
    def marked_accept(self: Any, request: Any, sender: Any) -> None:
        accepted.setdefault(request.request_id(), now())
        accept(self, request, sender)

    send = pending.send

    @functools.wraps(send)
    def marked_send(self: Any, response: Any, *, final: bool) -> None:
        start = now()
        send(self, response, final=final)
        entered = accepted.pop(self.triton_id, None)
        if entered is not None:
            line = {"triton_id": self.triton_id, "engine.accept": entered,
                    "engine.first_send.start": start, "engine.first_send.end": now()}  # fmt: skip
            with lock:
                out.write(json.dumps(line) + "\n")

    model._accept = marked_accept
    pending.send = marked_send
