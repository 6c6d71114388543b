"""What a host gives the HTTP frontend of a tritonserver started on it.

Triton's HTTP frontend hands every ``generate_stream`` response to the event thread of the
request's connection by writing a small command to a non-blocking ``AF_UNIX`` socket pair
(libevhtp's ``evthr_defer``), and ignores a failed write. A thread behind by more commands than
the socket's buffer holds therefore loses responses: streams end short of their last tokens, or
never end. The buffer is the host's ``net.core.wmem_default`` when tritonserver starts: about 278
responses at the usual 212,992 bytes. At ``SAFE_QUEUE_BYTES`` nothing was lost on the
stream-integrity bench (one event thread, 2 cores) or the capacity bench (1,024 streams, 16
cores), where the usual buffer lost responses on both (docs/deployment/transports.md).

The response keeper (``keeper``), preloaded into a sidecar's tritonserver, makes such a write
wait for room instead: that tritonserver keeps every response on any buffer.
"""

from __future__ import annotations

from pathlib import Path

SAFE_QUEUE_BYTES = 8 * 1024 * 1024
"""The ``net.core.wmem_default`` from which Triton's HTTP frontend is taken to keep every
response (``sysctl -w net.core.wmem_default=8388608``)."""
WMEM_DEFAULT = Path("/proc/sys/net/core/wmem_default")


def queue_bytes(path: Path | None = None) -> int | None:
    """This host's ``net.core.wmem_default`` (or what ``path`` holds); None where it cannot be
    read."""
    try:
        return int((path or WMEM_DEFAULT).read_text())
    except (OSError, ValueError):
        return None


def keeps_responses(queue: int | None, *, keeper: bool = False) -> bool:
    """Whether a tritonserver keeps every ``generate_stream`` response under load: one with the
    response keeper preloaded, or one on a host whose ``net.core.wmem_default`` is ``queue``."""
    return keeper or (queue is not None and queue >= SAFE_QUEUE_BYTES)
