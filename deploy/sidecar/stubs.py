"""A tritonserver's Python-backend stub processes, and the one that died while its model lives on.

Each instance of a Python model runs in a stub process that tritonserver starts. When a stub
dies (killed for memory, a crash in native code, its watchdog), tritonserver answers the model's
requests with "Stub process '<model>_0_0' is not healthy." and goes on reporting the model and
itself ready; Triton 2.51 never starts the stub again, for a decoupled model (the BLS, the
engine) or not (the pre- and postprocessing). Neither readiness nor a request that fails tells
the supervisor, so it counts the stubs: a model with fewer stubs than it had, while Triton
still calls it ready, is broken until tritonserver restarts.
"""

from __future__ import annotations

import re
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

STUB_COMM = "triton_python_b"
"""``triton_python_backend_stub`` as ``/proc/<pid>/stat`` names it (15 characters)."""
PROC = Path("/proc")
_PYTHON_BACKEND = re.compile(r'^\s*backend\s*:\s*"python"', re.MULTILINE)


def python_models(repository: Path) -> list[str]:
    """The models of a Triton model repository that run on the Python backend."""
    models = []
    for config in Path(repository).glob("*/config.pbtxt"):
        try:
            text = config.read_text(errors="replace")
        except OSError:
            continue
        if _PYTHON_BACKEND.search(text):
            models.append(config.parent.name)
    return sorted(models)


def stub_models(server_pid: int, proc: Path = PROC) -> Counter[str]:
    """The stub processes of tritonserver ``server_pid``, counted by model.

    A stub's command line is ``triton_python_backend_stub <repository>/<model>/<version>/
    model.py ...``; its parent is the server.
    """
    counts: Counter[str] = Counter()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            if comm != STUB_COMM or int(stat[stat.rindex(")") + 2 :].split()[1]) != server_pid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not readable
        if len(argv) > 1:
            counts[Path(argv[1].decode(errors="replace")).parent.parent.name] += 1
    return counts


class StubWatch:
    """Notices a model of one tritonserver whose stub died while the model is still loaded.

    Each of ``models`` (the repository's Python models) has at least one stub once the server
    is ready, and as many as were ever seen at once; where no stub of the server is to be seen
    at all (a ``tritonserver`` that is a wrapper, its stubs not its children), the watch expects
    nothing. ``check`` compares the stubs now with that: a shortfall seen on ``confirm`` checks
    in a row (tritonserver may be starting a stub again) on a model that ``model_ready`` still
    calls ready names the model. A model that is no longer ready (unloaded through the
    repository API) lowers its count instead: its stubs left on purpose.
    """

    def __init__(
        self,
        server_pid: int,
        model_ready: Callable[[str], bool],
        models: Iterable[str] = (),
        *,
        confirm: int = 2,
        proc: Path = PROC,
    ) -> None:
        self.server_pid = server_pid
        self.model_ready = model_ready
        self.confirm = confirm
        self.proc = proc
        seen = stub_models(server_pid, proc)
        self.expected: Counter[str] = Counter(dict.fromkeys(models, 1) if seen else {})
        """The stubs each watched model should have (its key stays while it is watched)."""
        self._short: Counter[str] = Counter()

    @classmethod
    def of_server(cls, server_pid: int, repository: Path, http_url: str) -> StubWatch:
        """The watch of a tritonserver serving ``repository`` at ``http_url``."""
        return cls(
            server_pid,
            lambda model: model_ready(http_url, model),
            python_models(repository),
        )

    def check(self) -> str | None:
        """The model whose stub died (its count confirmed short, and Triton calls it ready),
        or None."""
        if not self.expected:
            return None
        now = stub_models(self.server_pid, self.proc)
        for model, count in now.items():
            if model in self.expected:
                self.expected[model] = max(self.expected[model], count)
        for model, wanted in list(self.expected.items()):
            if now[model] >= wanted:
                self._short.pop(model, None)
                continue
            self._short[model] += 1
            if self._short[model] < self.confirm:
                continue
            if self.model_ready(model):
                return model
            self.expected[model] = now[model]
            self._short.pop(model, None)
        return None


def model_ready(http_url: str, model: str) -> bool:
    """Whether Triton at ``http_url`` calls ``model`` ready; a server that does not answer, no."""
    try:
        with urllib.request.urlopen(f"{http_url}/v2/models/{model}/ready", timeout=2.0) as answer:
            return bool(answer.status == 200)
    except Exception:
        return False
