"""The response head held for the exchange's next write: one write for a head and its first
body, a head alone sent at the next turn of the loop, an interim ``100 Continue`` never held; and
under uvicorn, a streamed answer's head and first chunk in one read, and a head whose body is
late sent ahead of it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn

from gateway.http.protocol import HeadWithBody, HeadWithBodyProtocol
from tests.support.gateway import free_port

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def test_head_goes_out_with_the_first_body_in_one_write() -> None:
    inner = Recorder()
    transport = HeadWithBody(inner)  # type: ignore[arg-type]
    transport.write(HEAD)
    assert inner.writes == []
    transport.write(b"5\r\nhello\r\n")
    transport.write(b"3\r\nbye\r\n")
    await asyncio.sleep(0)
    assert inner.writes == [HEAD + b"5\r\nhello\r\n", b"3\r\nbye\r\n"]


async def test_a_head_with_nothing_after_it_goes_out_at_the_next_turn() -> None:
    inner = Recorder()
    transport = HeadWithBody(inner)  # type: ignore[arg-type]
    transport.write(HEAD)
    await asyncio.sleep(0)
    assert inner.writes == [HEAD]
    transport.write(b"body")
    assert inner.writes == [HEAD, b"body"]


async def test_continue_is_never_held_and_close_sends_a_held_head_first() -> None:
    inner = Recorder()
    transport = HeadWithBody(inner)  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert inner.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    transport.write(HEAD)
    transport.close()
    assert inner.writes[1:] == [HEAD] and inner.closed
    assert transport.get_extra_info("peername") == "info:peername"


class _Server:
    """uvicorn on a free port with ``HeadWithBodyProtocol``, in a thread."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, http=HeadWithBodyProtocol, log_config=None
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                return self
            threading.Event().wait(0.01)
        raise RuntimeError("uvicorn did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def _request(port: int, path: str) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return client


def test_under_uvicorn_a_stream_head_and_first_chunk_arrive_together() -> None:
    started = threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        started.set()
        # The loop stands still while the client reads: whatever uvicorn wrote for the start
        # alone is all it can get.
        time.sleep(0.2)
        await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    with _Server(app) as server, _request(server.port, "/") as client:
        assert started.wait(10)
        first = client.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"\r\n\r\nd\r\ndata: first\n\n\r\n" in first, first


def test_under_uvicorn_a_head_whose_body_is_late_is_sent_ahead_of_it() -> None:
    head_seen = threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        # The body waits for the client to have the head: held until the body, it never would.
        while not head_seen.is_set():
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"late", "more_body": False})

    with _Server(app) as server, _request(server.port, "/") as client:
        head = client.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
        head_seen.set()
        rest = b""
        while not rest.endswith(b"0\r\n\r\n"):
            rest += client.recv(65536)
        assert rest == b"4\r\nlate\r\n0\r\n\r\n"
