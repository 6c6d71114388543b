"""Marks of the engine's side for ``tests.benchmarks.marks_report``: in a Triton Python-backend
stub, when each request reached the engine model (``engine.accept``), was read and checked
(``engine.parsed``), had its first output from the engine (``engine.first_output``) and when its
first response went out (``engine.first_send``).

The stubs ignore ``PYTHONPATH``, so a ``.pth`` file in the site-packages of the environment
they run (the sidecar's ``text_python_env``, or the gateway's own) installs it::

    python tests/benchmarks/first_token_marks/first_token_engine_marks.py SITE_PACKAGES

Then, whenever ``FIRST_TOKEN_MARKS`` names a folder, each stub appends a JSON line per request to
``engine-<pid>.jsonl`` there with Triton's request id (the gateway's, which its own marks
record as ``triton_id``; empty for direct Triton's requests), in the host's monotonic
nanoseconds as the gateway's marks are; without it the file does nothing. ``--remove`` takes
the ``.pth`` away. The engine model's module is patched once imported, by its name, so a renamed
method fails loudly.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
import threading
import time
from types import ModuleType
from typing import Any

MODULE = "deploy.triton.engine.triton_model"
PTH = "first_token_engine_marks.pth"


def boot(here: str) -> None:
    """From the ``.pth``: out of the path again (the gateway's ``sitecustomize`` beside this file
    is for processes that ask for it), and in a stub only, marks from the engine model."""
    sys.path.remove(here)
    try:
        exe = os.path.basename(os.readlink("/proc/self/exe"))
    except OSError:
        return
    # The stub may read the site's .pth files twice: one finder is enough.
    if exe == "triton_python_backend_stub" and not any(
        isinstance(finder, _AfterImport) for finder in sys.meta_path
    ):
        sys.meta_path.insert(0, _AfterImport(os.environ["FIRST_TOKEN_MARKS"]))


def main() -> None:
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description="(Un)install the engine's marks in stubs.")
    parser.add_argument("site_packages", type=Path)
    parser.add_argument("--remove", action="store_true")
    args = parser.parse_args()
    pth = args.site_packages / PTH
    if args.remove:
        pth.unlink(missing_ok=True)
        return
    here = str(Path(__file__).resolve().parent)
    pth.write_text(
        f"import os, sys; os.environ.get('FIRST_TOKEN_MARKS') and (sys.path.insert(0, {here!r}) "
        f"or __import__('first_token_engine_marks').boot({here!r}))\n"
    )
    print(f"wrote {pth}")


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

    now = time.monotonic_ns
    out = open(f"{folder}/engine-{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115
    lock = threading.Lock()
    # By the request object, not Triton's id: requests sent without an id (direct Triton's) are
    # marked too. Entries live until the request's first response went out.
    started: dict[int, dict[str, int]] = {}
    current = threading.local()
    model = module.TritonPythonModel
    pending = module._Pending
    accept, checked, on_output, send = model._accept, model._checked, model._on_output, pending.send

    @functools.wraps(accept)
    def marked_accept(self: Any, request: Any, sender: Any) -> None:
        current.marks = started.setdefault(id(request), {"engine.accept": now()})
        try:
            accept(self, request, sender)
        finally:
            current.marks = None

    @functools.wraps(checked)
    def marked_checked(self: Any, items: Any) -> Any:
        result = checked(self, items)
        marks = getattr(current, "marks", None)
        if marks is not None:
            marks["engine.parsed"] = now()
        return result

    @functools.wraps(on_output)
    def marked_on_output(self: Any, state: Any, output: Any) -> None:
        marks = started.get(id(state.request))
        if marks is not None:
            marks.setdefault("engine.first_output", now())
        on_output(self, state, output)

    @functools.wraps(send)
    def marked_send(self: Any, response: Any, *, final: bool) -> None:
        start = now()
        send(self, response, final=final)
        marks = started.pop(id(self.request), None)
        if marks is not None:
            line = {"triton_id": self.triton_id, **marks,
                    "engine.first_send.start": start, "engine.first_send.end": now()}  # fmt: skip
            with lock:
                out.write(json.dumps(line) + "\n")

    model._accept = marked_accept
    model._checked = marked_checked
    model._on_output = marked_on_output
    pending.send = marked_send


if __name__ == "__main__":
    main()
