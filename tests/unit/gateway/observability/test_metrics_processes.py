"""With several workers, the metrics' values know their process without asking the kernel at
every change, and a forked child still writes values of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import json, os
# Counted from before prometheus_client takes it as its default way to know the process.
asked = []
real = os.getpid
os.getpid = lambda: asked.append(1) or real()
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
import gateway.observability.metrics  # installs the value class

counter = Counter("jobs", "Jobs.", registry=None)
asked.clear()
for _ in range(10):
    counter.inc()
changes_asked = len(asked)
os.getpid = real
child = os.fork()
if child == 0:
    counter.inc(100)
    os._exit(0)
os.waitpid(child, 0)
counter.inc()
registry = CollectorRegistry()
MultiProcessCollector(registry, path=os.environ["PROMETHEUS_MULTIPROC_DIR"])
total = [line for line in generate_latest(registry).decode().splitlines()
         if line.startswith("jobs_total")]
print(json.dumps({"asked": changes_asked, "parent": real(), "child": child, "total": total}))
"""


def test_values_of_workers_ask_no_process_id_and_a_fork_writes_its_own(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    found = json.loads(done.stdout)
    assert found["asked"] == 0
    # The child's increments went to a file of its own, the parent's to its, and a scrape sums
    # both.
    files = {path.name for path in tmp_path.iterdir()}
    assert {f"counter_{found['parent']}.db", f"counter_{found['child']}.db"} <= files
    assert found["total"] == ["jobs_total 111.0"]
