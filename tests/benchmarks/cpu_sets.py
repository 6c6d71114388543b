"""CPU sets for a benchmark's process trees: Triton, the gateway and the load generator each on
cores of their own, as when each runs in a container with a CPU set (Kubernetes' static CPU
manager) instead of all of them sharing every core of the host.

``parse_cpus(["triton=0-8", "gateway=9-13", "load=14,15"])`` reads the sets; ``pin_tree`` puts
every thread of a running process tree on its set (threads and processes started later inherit
it from the ones that start them); ``pin_self`` does so for the calling process, whose children
(the load generator's processes) inherit it. ``pin_serving`` splits a gateway that supervises its
own sidecar: its ``tritonserver`` (and the Python-backend stubs under it) on Triton's set, the
rest of its tree on the gateway's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import psutil

from tests.benchmarks.serving import process_tree

ROLES = ("triton", "gateway", "load")


def parse_cpus(items: Iterable[str]) -> dict[str, frozenset[int]]:
    """``role=list`` items (a list as the kernel writes one: ``0-3,8,10-11``) as sets by role."""
    sets: dict[str, frozenset[int]] = {}
    for item in items:
        role, sep, listed = item.partition("=")
        if not sep or role not in ROLES:
            raise ValueError(f"{item!r}: expected one of {', '.join(ROLES)}, then = and CPUs")
        if role in sets:
            raise ValueError(f"{role} is given twice")
        sets[role] = cpu_list(listed)
    roles = list(sets)
    for index, role in enumerate(roles):
        for other in roles[index + 1 :]:
            shared = sets[role] & sets[other]
            if shared:
                raise ValueError(f"{role} and {other} share CPUs {sorted(shared)}")
    return sets


def cpu_list(listed: str) -> frozenset[int]:
    """The CPUs of a list such as ``0-3,8``."""
    cpus: set[int] = set()
    for part in listed.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{listed!r} is not a CPU list such as 0-3,8")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"{part!r} runs backwards")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def pin_tree(pid: int, cpus: frozenset[int]) -> int:
    """Every thread of ``pid``'s tree on ``cpus``; how many threads were pinned."""
    return sum(_pin(process, cpus) for process in process_tree(pid))


def pin_serving(
    gateway: int, sets: dict[str, frozenset[int]], server: str = "tritonserver"
) -> dict[str, int]:
    """A gateway that supervises its own sidecar, split: each of its ``server`` processes' trees
    (the Python-backend stubs under it) on Triton's set, the rest of its tree on the gateway's
    (a role without a set stays where it is); the threads pinned, by role. A sidecar the
    gateway restarts later starts on the gateway's set, where its supervisor runs."""
    tree = process_tree(gateway)
    tritons: set[int] = set()
    for process in tree:
        try:
            if process.name() == server:
                tritons.update(child.pid for child in process_tree(process.pid))
        except psutil.NoSuchProcess:
            continue
    if not tritons:
        raise LookupError(f"no {server} process under {gateway}")
    pinned = {"gateway": 0, "triton": 0}
    for process in tree:
        role = "triton" if process.pid in tritons else "gateway"
        if role in sets:
            pinned[role] += _pin(process, sets[role])
    return pinned


def _pin(process: psutil.Process, cpus: frozenset[int]) -> int:
    """Every thread of ``process`` on ``cpus``; how many were pinned."""
    try:
        threads = process.threads()
    except psutil.NoSuchProcess:
        return 0
    pinned = 0
    for thread in threads:
        try:
            os.sched_setaffinity(thread.id, cpus)
        except (ProcessLookupError, PermissionError):
            continue
        pinned += 1
    return pinned


def pin_self(cpus: frozenset[int]) -> None:
    """This process (its calling thread, and what it starts from now on) on ``cpus``."""
    os.sched_setaffinity(0, cpus)


def topology() -> str:
    """Each CPU's core siblings, as the kernel lists them (for the report)."""
    lists = set()
    for entry in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/thread_siblings_list"):
        lists.add(entry.read_text().strip())
    return " ".join(sorted(lists, key=lambda text: int(text.split(",")[0].split("-")[0])))
