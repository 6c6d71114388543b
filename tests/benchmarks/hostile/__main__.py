"""Every hostile attack in one go against one starter setup: one table of what each cost.

    python -m tests.benchmarks.hostile [--seconds 15]
        [--connections 19800] [--addresses 20]

On the runner's starter setup (``triton-gateway serve``, a sidecar on the CPU, ``team-a`` the
victim, each keyed attack a tenant with ``team-b``'s limits), for ``--seconds`` each:
grammar's schema nested 300 deep, requests' three oversize requests, door's two keyless attacks
(a 256 MiB request head, again each time the gateway closes on it; ``--connections``
connections from ``--addresses`` loopback addresses, each sending half a request head and a
header line every 2 s), and last grammar's costliest schema within the bounds. Prints one row
per attack as it ends, then the table.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

from tests.benchmarks.hostile import door, grammar, requests
from tests.benchmarks.hostile.runner import Attack, Window, run_attacks, starter, table

TRICKLE_S = 2.0
SECONDS_KEY = "seconds to the answer (median)"


def in_process(target: Callable[..., None], *args: Any) -> Attack:
    """A keyless attack of door's, run in a process of its own (thousands of sockets would
    otherwise starve the victim's thread of the GIL), its tally put in the window."""

    def attack(until: float, window: Window) -> None:
        context = multiprocessing.get_context("spawn")
        receiving, sending = context.Pipe(duplex=False)
        seconds = max(0.0, until - time.monotonic())
        process = context.Process(target=target, args=(*args[:1], seconds, *args[1:], sending))
        process.start()
        if receiving.poll(seconds + 60):
            tally: dict[str, Any] = receiving.recv()
            refusal = tally.pop(SECONDS_KEY, None)
            window.refusal_s = refusal
            window.answers = ", ".join(f"{name}: {value}" for name, value in tally.items())
        process.join(30)
        if process.is_alive():
            process.kill()

    return attack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--connections", type=int, default=19_800)
    parser.add_argument("--addresses", type=int, default=20)
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    with starter(2 + len(requests.ATTACKS)) as served:
        door_attacks = [
            ("256 MiB request head, no key", in_process(door.giant_head, served.port)),
            (
                f"{args.connections} half request heads, no key",
                in_process(
                    door.slowloris, served.port, args.connections, args.addresses, TRICKLE_S
                ),
            ),
        ]
        deep, costly = grammar.attacks(served.url, 0)
        chosen = [deep, *requests.attacks(served.url, 2)]
        chosen += [(name, [attack]) for name, attack in door_attacks]
        # Last: a compile past its timeout runs on to its end (xgrammar cannot stop one), on
        # the engine's compile threads, after the window.
        chosen.append(costly)
        rows = run_attacks(served, args.seconds, chosen)
    print(f"load average at the end: {os.getloadavg()}")
    print(table(rows))


if __name__ == "__main__":
    main()
