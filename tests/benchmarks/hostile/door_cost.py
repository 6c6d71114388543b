"""What the front door costs a friendly request: the server's CPU per request with and without it.

    python -m tests.benchmarks.hostile.door_cost [--requests 20000] [--rounds 3]

Serves an app that streams a head and one SSE chunk (the shape the head-with-body protocol
exists for) with uvicorn in a process of its own, once with ``HeadWithBodyProtocol`` and once
with the door's ``GuardedProtocol`` over it, and sends ``--requests`` requests one at a time on
one kept-alive connection from 127.0.0.1, then on a new connection each. Printed: the server
process's CPU time (user + system) per request, the best of ``--rounds`` (taken in turns).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import uvicorn

from gateway.http.door import Door, DoorLimits
from gateway.http.protocol import HeadWithBodyProtocol
from tests.support.gateway import free_port

REQUEST = b"GET /stream HTTP/1.1\r\nHost: cost\r\n\r\n"
END = b"0\r\n\r\n"


async def _app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b"data: token\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _serve(port: int, guarded: bool) -> None:
    protocol: Any = Door(DoorLimits()) if guarded else HeadWithBodyProtocol
    config = uvicorn.Config(
        _app, host="127.0.0.1", port=port, http=protocol, log_config=None, lifespan="off"
    )
    uvicorn.Server(config).run()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _exchange(sock: socket.socket) -> None:
    sock.sendall(REQUEST)
    data = b""
    while not data.endswith(END):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-answer")
        data += chunk


def _measure(port: int, pid: int, requests: int, kept: bool) -> float:
    before = _cpu_s(pid)
    if kept:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            for _ in range(requests):
                _exchange(sock)
    else:
        for _ in range(requests):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                _exchange(sock)
    return (_cpu_s(pid) - before) / requests * 1e6


def _server(guarded: bool) -> tuple[int, multiprocessing.process.BaseProcess]:
    port = free_port()
    process = multiprocessing.get_context("spawn").Process(target=_serve, args=(port, guarded))
    process.start()
    for _ in range(500):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return port, process
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("uvicorn did not start")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    servers = {guarded: _server(guarded) for guarded in (False, True)}
    try:
        for kept in (True, False):
            what = "one kept-alive connection" if kept else "a connection per request"
            best: dict[bool, float] = {}
            # Rounds alternate between the two servers, so that a change in the host's load
            # falls on both.
            for _ in range(args.rounds):
                for guarded, (port, process) in servers.items():
                    assert process.pid is not None
                    cost = _measure(port, process.pid, args.requests, kept)
                    best[guarded] = min(best.get(guarded, cost), cost)
            for guarded, cost in best.items():
                name = "GuardedProtocol" if guarded else "HeadWithBodyProtocol"
                print(f"{what:28} {name:22} server CPU {cost:6.1f} us/request")
    finally:
        for _, process in servers.values():
            process.terminate()
            process.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
