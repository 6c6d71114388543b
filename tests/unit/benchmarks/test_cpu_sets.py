"""The benchmarks' CPU sets: the roles' lists read as the kernel writes them, and a running
process tree, threads and children, put on one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.benchmarks.cpu_sets import cpu_list, parse_cpus, pin_serving, pin_tree, topology
from tests.benchmarks.serving import process_tree

CHILD = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(grandchild.pid, flush=True)
time.sleep(60)
"""


def test_roles_and_lists_are_read_as_the_kernel_writes_them() -> None:
    sets = parse_cpus(["triton=0-3,8", "gateway=4-5", "load=6"])
    assert sets == {
        "triton": frozenset({0, 1, 2, 3, 8}),
        "gateway": frozenset({4, 5}),
        "load": frozenset({6}),
    }
    assert cpu_list("7") == frozenset({7})


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["engine=0-3"], "expected one of"),
        (["triton"], "expected one of"),
        (["triton=0-3", "triton=4"], "given twice"),
        (["triton=0-3", "gateway=3-4"], "share CPUs [3]"),
        (["load=3-1"], "runs backwards"),
        (["load=a"], "not a CPU list"),
    ],
)
def test_wrong_sets_are_refused(items: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_cpus(items)


def _allowed(tid: int) -> set[int]:
    return set(os.sched_getaffinity(tid))


def test_every_thread_of_every_process_of_a_tree_is_pinned() -> None:
    one = frozenset({min(os.sched_getaffinity(0))})
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        deadline = time.monotonic() + 10
        while len(list(Path(f"/proc/{child.pid}/task").iterdir())) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert {process.pid for process in process_tree(child.pid)} >= {child.pid, grandchild}
        threads = [
            int(task.name)
            for pid in (child.pid, grandchild)
            for task in Path(f"/proc/{pid}/task").iterdir()
        ]
        assert pin_tree(child.pid, one) >= len(threads) >= 3
        assert all(_allowed(thread) == set(one) for thread in threads)
    finally:
        for process in process_tree(child.pid)[::-1]:
            process.kill()
        child.wait()


SERVER = """
import subprocess, sys, time
stub = subprocess.Popen([sys.argv[1], "-c", "import time; time.sleep(60)"])
print(stub.pid, flush=True)
time.sleep(60)
"""
GATEWAY = """
import subprocess, sys, time
server = subprocess.Popen([sys.argv[1], "-c", sys.argv[2], sys.executable],
                          stdout=subprocess.PIPE, text=True)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(server.pid, server.stdout.readline().strip(), worker.pid, flush=True)
time.sleep(60)
"""


def test_a_gateways_sidecar_goes_on_tritons_set_and_the_rest_on_the_gateways(
    tmp_path: Path,
) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("two CPUs are needed to tell the sets apart")
    sets = {"gateway": frozenset({allowed[0]}), "triton": frozenset({allowed[1]})}
    # Named as Triton's server is: a process's name is the name it was started by.
    server = tmp_path / "tritonserver"
    server.symlink_to(sys.executable)
    gateway = subprocess.Popen(
        [sys.executable, "-c", GATEWAY, str(server), SERVER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert gateway.stdout is not None
        server_pid, stub, worker = map(int, gateway.stdout.readline().split())
        pinned = pin_serving(gateway.pid, sets)
        assert pinned["gateway"] >= 2 and pinned["triton"] >= 2
        for pid in (server_pid, stub):
            assert _allowed(pid) == set(sets["triton"])
        for pid in (gateway.pid, worker):
            assert _allowed(pid) == set(sets["gateway"])
        with pytest.raises(LookupError, match="no nginx process"):
            pin_serving(gateway.pid, sets, server="nginx")
    finally:
        for process in process_tree(gateway.pid)[::-1]:
            process.kill()
        gateway.wait()


def test_the_topology_names_every_cpu() -> None:
    listed = topology()
    named = set().union(*(cpu_list(siblings) for siblings in listed.split()))
    assert named >= set(os.sched_getaffinity(0))
