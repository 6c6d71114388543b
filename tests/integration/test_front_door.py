"""The front door on loopback, against a real gateway served by uvicorn: a giant head answered
431 unread, a slow head 408, a silent or idle connection closed, a slow body 408, and the
connection caps (in all and per peer address) answering 503 while a client within them is
served. Client addresses other than 127.0.0.1 are other loopback addresses (127.0.0.0/8)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from gateway.observability import MetricsSettings, ObservabilitySettings
from gateway.settings import ServerSettings, Settings
from gateway.tenancy import TenancySettings
from tests.support.gateway import LiveGateway, free_port

HEALTH = b"GET /health/live HTTP/1.1\r\nHost: door\r\n\r\n"
WAIT_S = 10.0
"""How long a client waits for an answer before the test fails (never a measure of speed)."""


@pytest.fixture
def door() -> Iterator[Callable[..., LiveGateway]]:
    """Starts a gateway whose server takes the given ``ServerSettings`` fields (and serves
    the metrics on ``metrics_port`` where given)."""
    started: list[LiveGateway] = []

    def start(metrics_port: int | None = None, **server: Any) -> LiveGateway:
        settings = Settings(
            server=ServerSettings(**server),
            tenancy=TenancySettings(auth=False),
            observability=ObservabilitySettings(metrics=MetricsSettings(port=metrics_port)),
        )
        gateway = LiveGateway(settings).start()
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


def connect(
    gateway: LiveGateway, source: str = "127.0.0.1", port: int | None = None
) -> socket.socket:
    return socket.create_connection(
        ("127.0.0.1", port or gateway.port), timeout=WAIT_S, source_address=(source, 0)
    )


def read_answer(client: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of one answer (its ``content-length`` long), read to its
    last byte and no further: an answer pipelined after it stays for the next call."""
    raw = client.makefile("rb", buffering=0)
    status = raw.readline()
    if not status:
        raise ConnectionError("closed before an answer")
    headers: dict[str, str] = {}
    while (line := raw.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.lower()] = value.strip()
    body = b""
    while len(body) < int(headers.get("content-length", "0")):
        chunk = raw.read(int(headers["content-length"]) - len(body))
        if not chunk:
            raise ConnectionError(f"closed mid-body: {body!r}")
        body += chunk
    return int(status.split()[1]), headers, body


def closed_by_server(client: socket.socket) -> bool:
    """Whether the server closed the connection (after anything it still had to say)."""
    try:
        while client.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_a_giant_head_gets_431_without_being_read(door: Callable[..., LiveGateway]) -> None:
    gateway = door(max_head_bytes=4096)
    client = connect(gateway)
    chunk = b"a" * 65536
    sent = 0
    offered = 64 * 1024 * 1024
    with client:
        try:
            client.sendall(b"GET /health/live HTTP/1.1\r\nHost: door\r\nX-Big: ")
            while sent < offered:
                client.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, headers, body = read_answer(client)
    assert status == 431
    assert headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "request_header_fields_too_large"
    # What was taken is at most the socket buffers' worth, not the 64 MiB offered.
    assert sent < offered // 4


def test_a_head_that_does_not_finish_gets_408(door: Callable[..., LiveGateway]) -> None:
    gateway = door(head_timeout_s=0.3)
    with connect(gateway) as client:
        client.sendall(b"GET /health/live HTTP/1.1\r\nHost: door\r\nX-Slow: ")
        status, headers, body = read_answer(client)
        assert status == 408
        assert headers["connection"] == "close"
        assert json.loads(body)["error"]["type"] == "invalid_request_error"
        assert closed_by_server(client)


def test_silent_and_idle_connections_are_closed(door: Callable[..., LiveGateway]) -> None:
    gateway = door(head_timeout_s=0.3, keep_alive_s=1)
    with connect(gateway) as silent:
        assert silent.recv(1) == b""
    with connect(gateway) as idle:
        idle.sendall(HEALTH)
        assert read_answer(idle)[0] == 200
        assert idle.recv(1) == b""


def test_a_body_that_does_not_arrive_gets_408(door: Callable[..., LiveGateway]) -> None:
    gateway = door(body_timeout_s=0.3)
    with connect(gateway) as client:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: door\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            b'{"model": "x", '
        )
        status, headers, body = read_answer(client)
        assert status == 408
        assert headers["connection"] == "close"
        assert json.loads(body)["error"]["message"].startswith("the request body")
        assert closed_by_server(client)


def test_past_the_connection_cap_503_while_a_client_within_it_is_served(
    door: Callable[..., LiveGateway],
) -> None:
    gateway = door(max_connections=4, max_connections_per_peer=4)
    kept = connect(gateway, "127.0.0.2")
    held = [connect(gateway, f"127.0.0.{3 + i}") for i in range(3)]
    try:
        kept.sendall(HEALTH)
        assert read_answer(kept)[0] == 200
        with connect(gateway, "127.0.0.9") as refused:
            status, headers, body = read_answer(refused)
            assert status == 503
            assert headers["retry-after"] == "5"
            assert "most connections (4)" in msgspec.json.decode(body)["error"]["message"]
            assert closed_by_server(refused)
        kept.sendall(HEALTH)
        assert read_answer(kept)[0] == 200
    finally:
        for client in [kept, *held]:
            client.close()


def test_past_the_cap_of_one_address_503_while_other_addresses_are_served(
    door: Callable[..., LiveGateway],
) -> None:
    gateway = door(max_connections=64, max_connections_per_peer=2)
    held = [connect(gateway, "127.0.0.2") for _ in range(2)]
    try:
        with connect(gateway, "127.0.0.2") as refused:
            status, _, body = read_answer(refused)
            assert status == 503
            assert "this address" in msgspec.json.decode(body)["error"]["message"]
        with connect(gateway, "127.0.0.3") as other:
            other.sendall(HEALTH)
            assert read_answer(other)[0] == 200
        held[0].sendall(HEALTH)
        assert read_answer(held[0])[0] == 200
    finally:
        for client in held:
            client.close()


def test_what_follows_a_head_within_the_limit_is_read_as_usual(
    door: Callable[..., LiveGateway],
) -> None:
    """A head under the limit arriving in one read with more than the limit's worth after it (a
    body, a pipelined request) is served: only bytes of a head count."""
    gateway = door(max_head_bytes=1024)
    body = json.dumps({"model": "absent", "messages": [], "user": "u" * 4000}).encode()
    with connect(gateway) as client:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: door\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        status, _, answer = read_answer(client)
        assert status == 400
        assert json.loads(answer)["error"]["param"] == "messages"
        client.sendall(HEALTH * 40)
        assert [read_answer(client)[0] for _ in range(40)] == [200] * 40


def test_the_metrics_port_keeps_the_same_bounds_with_counts_of_its_own(
    door: Callable[..., LiveGateway],
) -> None:
    metrics_port = free_port()
    gateway = door(metrics_port=metrics_port, max_connections=1, max_head_bytes=1024)
    with connect(gateway) as api, connect(gateway, port=metrics_port) as scrape:
        api.sendall(HEALTH)
        assert read_answer(api)[0] == 200
        with connect(gateway, port=metrics_port) as refused:
            assert read_answer(refused)[0] == 503
        scrape.sendall(b"GET /metrics HTTP/1.1\r\nHost: door\r\nX-Big: " + b"a" * 4096)
        assert read_answer(scrape)[0] == 431


def test_an_upgrade_to_a_websocket_stays_within_the_door(
    door: Callable[..., LiveGateway],
) -> None:
    """No route takes a WebSocket: an upgrade is answered as plain HTTP, and its connection
    stays counted by the door until it closes."""
    gateway = door(max_connections=1)
    upgrade = (
        b"GET /health/live HTTP/1.1\r\nHost: door\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    for _ in range(3):
        with connect(gateway) as client:
            client.sendall(upgrade)
            assert read_answer(client)[0] == 200
    with connect(gateway) as client:
        client.sendall(HEALTH)
        assert read_answer(client)[0] == 200
