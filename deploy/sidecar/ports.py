"""Ports for sidecars: free ones, away from the kernel's range for outgoing connections."""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_FLOOR = 24000
"""The lowest port a sidecar is given when its spec names none."""
_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_GIVEN: set[int] = set()
"""Ports this process has handed out: free when picked, but perhaps not yet bound by their
server (a sidecar's three are picked before it starts)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody uses right now, from ``PORT_FLOOR`` up to the kernel's ephemeral range.

    Not one of that range (what binding port 0 gives): outgoing connections take their local
    ports from it, and one of them could hold a sidecar's port in the moment it restarts. The
    kernel's choice where that leaves too little room, or no random pick was free. Never one
    this process handed out before.
    """
    try:
        ephemeral = int(_PORT_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    roomy = ephemeral - PORT_FLOOR >= 1000
    for attempt in range(128):
        port = random.randrange(PORT_FLOOR, ephemeral) if roomy and attempt < 64 else 0
        if port in _GIVEN:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            port = int(sock.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise OSError(f"no free port on {host}")
