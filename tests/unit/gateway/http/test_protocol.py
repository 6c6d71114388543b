"""The response head held for the exchange's next write: one write for a head and its first
body, a head alone sent at the next turn of the loop, an interim ``100 Continue`` never held; and
under uvicorn, a streamed answer's head and first chunk in one read, and a head whose body is
late sent ahead of it. Where asyncio starts tasks eagerly (3.12 on), a request read whole starts
its app while its bytes are being handled, its body in; pipelined and late bodies still arrive
whole, and what an app sets in its context stays in its request."""

from __future__ import annotations

import asyncio
import contextvars
import socket
import threading
import time
from typing import Any

import uvicorn

from gateway.http.protocol import EAGER, HeadWithBody, HeadWithBodyProtocol
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

    def __init__(
        self, app: Any, protocol: type[HeadWithBodyProtocol] = HeadWithBodyProtocol
    ) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, http=protocol, log_config=None
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


class _Watched(HeadWithBodyProtocol):
    """Marks while the protocol handles bytes that arrived."""

    handling = False

    def data_received(self, data: bytes) -> None:
        _Watched.handling = True
        try:
            super().data_received(data)
        finally:
            _Watched.handling = False


_SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="-")


async def _echo(scope: Any, receive: Any, send: Any) -> None:
    """Answers with whether it started while its bytes were handled, what its context held
    (``-``: nothing another request set), and its body as it read it."""
    if scope["type"] != "http":
        return
    inside = _Watched.handling
    before = _SEEN.get()
    _SEEN.set(scope["path"])
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    answer = b"%d %s %s" % (inside, before.encode(), body)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(answer)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": answer, "more_body": False})


def _post(path: str, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        path.encode(), len(body), body,
    )  # fmt: skip


def _answers(client: socket.socket, count: int) -> list[bytes]:
    """The bodies of the next ``count`` answers (each with a ``content-length``) on ``client``."""
    raw = b""
    while True:
        answers, rest = [], raw
        while b"\r\n\r\n" in rest:
            head, _, rest = rest.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(rest) < length:
                break
            answers.append(rest[:length])
            rest = rest[length:]
        if len(answers) >= count:
            return answers
        piece = client.recv(65536)
        if not piece:
            raise AssertionError(f"the connection closed after {raw!r}")
        raw += piece


def test_a_request_read_whole_starts_its_app_at_once_where_asyncio_can() -> None:
    with (
        _Server(_echo, _Watched) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as client,
    ):
        client.sendall(_post("/a", b"hello"))
        assert _answers(client, 1) == [b"%d - hello" % EAGER]
        # The next request on the connection: what the first set in its context stayed there.
        client.sendall(_post("/b", b"again"))
        assert _answers(client, 1) == [b"%d - again" % EAGER]


def test_pipelined_and_late_bodies_arrive_whole() -> None:
    with _Server(_echo, _Watched) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
            # Two requests in one packet: the second waits in uvicorn's pipeline.
            client.sendall(_post("/one", b"first") + _post("/two", b"second"))
            first, second = _answers(client, 2)
            assert first == b"%d - first" % EAGER
            assert second.startswith(b"0 ") and second.endswith(b" second")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
            # The head first, its body later: the app waits for it.
            request = _post("/late", b"body after head")
            head_end = request.index(b"\r\n\r\n") + 4
            client.sendall(request[:head_end])
            time.sleep(0.1)
            client.sendall(request[head_end:])
            assert _answers(client, 1) == [b"%d - body after head" % EAGER]
