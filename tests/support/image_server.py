"""A real HTTP server on a loopback port that serves an image, redirects, stalls and fails.

Routes: ``/image`` (the image, served as ``text/plain``: the type must not matter), ``/sized?n=``
(n bytes with a Content-Length), ``/unsized?n=`` (n bytes without one, ended by closing),
``/stall`` (headers, then nothing until the server stops), ``/redirect?left=n`` (n redirects,
then the image), ``/to?url=`` (one redirect to ``url``), anything else 404. Each request's path
and Host header are recorded.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass
class ImageServer:
    image: bytes
    port: int = 0
    seen: list[tuple[str, str]] = field(default_factory=list)
    """(path, Host header) of each request, in order."""
    stop: threading.Event = field(default_factory=threading.Event)
    scheme: str = "http"
    server_names: list[str | None] = field(default_factory=list)
    """The TLS server name (SNI) of each handshake, over https."""

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"


def _handler(server: ImageServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            server.seen.append((self.path, self.headers.get("Host", "")))
            parts = urlsplit(self.path)
            query = {key: values[0] for key, values in parse_qs(parts.query).items()}
            if parts.path == "/image":
                self._send(200, server.image, {"Content-Type": "text/plain"})
            elif parts.path == "/sized":
                self._send(200, b"\0" * int(query["n"]), {})
            elif parts.path == "/unsized":
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"\0" * int(query["n"]))
                self.close_connection = True
            elif parts.path == "/stall":
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                server.stop.wait(10)
            elif parts.path == "/redirect" and query["left"] == "0":
                self._send(200, server.image, {"Content-Type": "image/png"})
            elif parts.path == "/redirect":
                location = f"/redirect?left={int(query['left']) - 1}"
                self._send(302, b"", {"Location": location})
            elif parts.path == "/to":
                self._send(302, b"", {"Location": query["url"]})
            else:
                self._send(404, b"not here", {})

        def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextmanager
def serve_images(image: bytes, tls: ssl.SSLContext | None = None) -> Iterator[ImageServer]:
    """The server, running in a thread until the block ends; over https with ``tls``."""
    server = ImageServer(image)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    if tls is not None:
        server.scheme = "https"
        tls.sni_callback = lambda _socket, name, _context: server.server_names.append(name)
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    httpd.daemon_threads = True
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, name="image-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
