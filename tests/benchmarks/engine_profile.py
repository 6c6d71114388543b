"""Sampling the engine's Python-backend stub with py-spy while a benchmark level runs.

The torch engine steps its batch on one thread: whatever that thread does per step (the
forward pass, sampling, building each sequence's response) sets the time between tokens of
every stream. A profile per target shows what a request's extra outputs cost there.
"""

from __future__ import annotations

import asyncio
import collections
import re
import subprocess
from pathlib import Path

# What the engine thread's time is split into, by the first of these frames on its stack.
PHASES = (
    ("forward", "ModelRunner.decode"),
    ("prefill", "Engine._prefill"),
    ("sampling and bookkeeping", "DecodeBatch.advance"),
    ("responses", "TritonPythonModel._on_output"),
)
_ENGINE_THREAD = "torch-engine"


def stub_pid(model: str) -> int | None:
    """The pid of the stub that runs ``<model>_tensorrt_llm``."""
    found = subprocess.run(
        ["pgrep", "-f", f"/{re.escape(model)}_tensorrt_llm/1/model.py"],
        capture_output=True,
        text=True,
    ).stdout.split()
    return int(found[0]) if found else None


async def record(py_spy: Path, model: str, out: Path, delay_s: float, seconds: int) -> Path:
    """After ``delay_s``, sample the engine stub for ``seconds`` into ``out`` (folded stacks,
    one thread per stack root)."""
    await asyncio.sleep(delay_s)
    pid = stub_pid(model)
    if pid is None:
        raise RuntimeError(f"no stub runs {model}_tensorrt_llm")
    process = await asyncio.create_subprocess_exec(
        str(py_spy), "record", "-p", str(pid), "-d", str(seconds), "-r", "200",
        "--threads", "--nonblocking", "--format", "raw", "-o", str(out),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, errors = await process.communicate()
    if not out.exists():
        raise RuntimeError(f"py-spy wrote no profile: {errors.decode(errors='replace')[-500:]}")
    return out


def split(folded: Path) -> dict[str, float]:
    """The engine thread's samples by phase, as shares of all its samples (``other``: the rest
    of its loop), and ``samples``."""
    phases: collections.Counter[str] = collections.Counter()
    total = 0
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or _ENGINE_THREAD not in frames[0]:
            continue
        total += int(count)
        names = [re.sub(r" \(.*\)$", "", frame) for frame in frames[1:]]
        phase = next((label for label, frame in PHASES if frame in names), "other")
        phases[phase] += int(count)
    labels = [label for label, _ in PHASES] + ["other"]
    shares = {label: phases[label] / max(total, 1) for label in labels}
    shares["samples"] = float(total)
    return shares
