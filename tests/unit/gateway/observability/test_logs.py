"""What the gateway logs at INFO: its own lines, not one per probe, scrape or library call."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from gateway.observability.logs import configure_logging, log_access
from gateway.observability.record import RequestRecord


class _Metrics(BaseHTTPRequestHandler):
    """A replica's metrics endpoint, as the gateway scrapes it."""

    def do_GET(self) -> None:
        body = b"nv_inference_pending_request_count 0\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def replica() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def log() -> Iterator[io.StringIO]:
    """The gateway's log as `configure_logging` sets it up, written to a buffer."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    libraries = {name: logging.getLogger(name).level for name in ("httpx", "httpcore")}
    stream = io.StringIO()
    try:
        yield stream
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        for name, was in libraries.items():
            logging.getLogger(name).setLevel(was)


def _configure(level: str, stream: io.StringIO) -> None:
    configure_logging(level, "text")
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)


def test_scraping_a_replica_logs_nothing_at_info(replica: str, log: io.StringIO) -> None:
    _configure("INFO", log)
    for _ in range(3):
        assert httpx.get(replica).status_code == 200
    logging.getLogger("gateway.replicas").info("replica up")
    lines = log.getvalue().splitlines()
    assert [line for line in lines if "httpx" in line or "httpcore" in line] == []
    assert any("replica up" in line for line in lines)


def test_library_lines_show_when_debug_is_asked(replica: str, log: io.StringIO) -> None:
    _configure("DEBUG", log)
    httpx.get(replica)
    assert "HTTP Request: GET" in log.getvalue()


@pytest.mark.parametrize(
    ("route", "shown"),
    [
        ("/health/ready", False),
        ("/health/live", False),
        ("/metrics", False),
        ("/metrics/sidecars/{name}", False),
        ("/v1/chat/completions", True),
    ],
)
def test_probes_and_scrapes_leave_no_access_line_at_info(
    route: str, shown: bool, log: io.StringIO
) -> None:
    _configure("INFO", log)
    log_access(RequestRecord("req-1", "GET", route, status=200), 0.001)
    assert (route in log.getvalue()) is shown
