"""Profiles each worker process of a gateway, for ``python -m tests.benchmarks.capacity
--profile DIR``: on this folder's ``PYTHONPATH``, a process that ``multiprocessing`` spawned for
``triton-gateway serve --config NAME.yaml`` runs under ``cProfile`` and writes
``DIR/NAME.PID.prof`` as it exits (``python -m tests.benchmarks.profiling DIR`` sums them up).
Any other process is left alone."""

import os
import sys


def _profile(folder: str) -> None:
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
            parent = cmdline.read().split(b"\0")
    except OSError:
        return
    config = next((part.decode() for part in parent if part.endswith(b".yaml")), "")
    if not config or not any(part.endswith(b"triton-gateway") for part in parent):
        return
    import atexit
    import cProfile

    name = os.path.basename(config).removesuffix(".yaml")
    profile = cProfile.Profile()
    profile.enable()

    def written() -> None:
        profile.disable()
        profile.dump_stats(os.path.join(folder, f"{name}.{os.getpid()}.prof"))

    atexit.register(written)


if os.environ.get("GATEWAY_PROFILE_DIR") and "--multiprocessing-fork" in sys.argv:
    _profile(os.environ["GATEWAY_PROFILE_DIR"])
