"""A test double of the Triton backend's calls: record a real server's answers, replay them.

Shipped beside the client it stands in for. Replaying keeps everything of the adapter that a
request runs (tensors, request bodies, the HTTP and server-sent-event parsing, the exchange
decoding responses into chunks) while no server is called: what an in-process benchmark of the
gateway's own CPU needs. Both transports are replayed: gRPC ``ModelStreamInfer`` calls as their
response messages, HTTP ``generate_stream`` calls as the bytes Triton wrote on the connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import grpc  # type: ignore[import-untyped]

from adapters.triton.client import TritonBackend
from adapters.triton.http.call import HttpStreams
from adapters.triton.http.pool import Connection


class _Replay:
    """A finished gRPC call's responses, read again."""

    def __init__(self, responses: list[Any]) -> None:
        self._responses = iter(responses)
        self._done = False

    async def read(self) -> Any:
        response = next(self._responses, grpc.aio.EOF)
        self._done = response is grpc.aio.EOF
        return response

    def done(self) -> bool:
        return self._done

    def cancel(self) -> None:
        pass


class _Recording:
    """A live gRPC call whose responses are kept for replay."""

    def __init__(self, call: Any, into: list[Any]) -> None:
        self._call = call
        self._into = into

    async def read(self) -> Any:
        response = await self._call.read()
        if response is not grpc.aio.EOF:
            self._into.append(response)
        return response

    def done(self) -> bool:
        return bool(self._call.done())

    def cancel(self) -> None:
        self._call.cancel()


def _tape_key(request: bytes) -> tuple[bytes, bool]:
    """An HTTP request's model path and streaming flag: what its recorded answer is kept by."""
    head, _, body = request.partition(b"\r\n\r\n")
    path = head.split(b" ", 2)[1]
    return path, b'"stream":[true]' in body or b'"streaming":[true]' in body


def _pieces(tape: list[bytes]) -> list[bytes]:
    """A recorded answer as Triton writes it: the head, then one HTTP chunk (one event) at a
    time, whatever the pieces the recording read it in."""
    raw = b"".join(tape)
    head_end = raw.find(b"\r\n\r\n") + 4
    pieces, rest = [raw[:head_end]], raw[head_end:]
    while rest:
        line_end = rest.find(b"\r\n")
        end = line_end + 2 + int(rest[:line_end].split(b";")[0], 16) + 2
        pieces.append(rest[:end])
        rest = rest[end:]
    return pieces


class _Wire:
    """One connection's two ends as a recording or replaying pair: the writer learns which
    request it carries, the reader records that request's answer or replays it, one event a
    read, as a paced engine's answer arrives."""

    def __init__(self, tapes: dict[tuple[bytes, bool], list[bytes]], replaying: bool,
                 connection: Connection | None) -> None:  # fmt: skip
        self.tapes = tapes
        self.replaying = replaying
        self.connection = connection
        self.tape: list[bytes] | None = None
        self.pieces: list[bytes] = []
        self.buffer = b""
        self.closed = False

    # The writer's side.
    def write(self, data: bytes) -> None:
        key = _tape_key(data)
        if self.replaying:
            self.pieces = _pieces(self.tapes[key])[::-1]
            return
        self.tape = self.tapes[key] = []
        assert self.connection is not None
        self.connection[1].write(data)

    def close(self) -> None:
        self.closed = True
        if self.connection is not None:
            self.connection[1].close()

    def is_closing(self) -> bool:
        return self.closed

    async def wait_closed(self) -> None:
        if self.connection is not None:
            await self.connection[1].wait_closed()

    # The reader's side.
    async def read(self, n: int = -1) -> bytes:
        if self.connection is not None:
            return self._kept(await self.connection[0].read(n))
        if not self.buffer and self.pieces:
            self.buffer = self.pieces.pop()
        data, self.buffer = self.buffer, b""
        return data

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        if self.connection is not None:
            return self._kept(await self.connection[0].readuntil(separator))
        while separator not in self.buffer:
            if not self.pieces:
                raise asyncio.IncompleteReadError(self.buffer, None)
            self.buffer += self.pieces.pop()
        end = self.buffer.index(separator) + len(separator)
        data, self.buffer = self.buffer[:end], self.buffer[end:]
        return data

    async def readexactly(self, n: int) -> bytes:
        if self.connection is not None:
            return self._kept(await self.connection[0].readexactly(n))
        while len(self.buffer) < n:
            if not self.pieces:
                raise asyncio.IncompleteReadError(self.buffer, n)
            self.buffer += self.pieces.pop()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def at_eof(self) -> bool:
        if self.connection is not None:
            return self.connection[0].at_eof()
        return not self.buffer and not self.pieces

    def _kept(self, data: bytes) -> bytes:
        if self.tape is not None:
            self.tape.append(data)
        return data


class ReplayingHttpStreams(HttpStreams):
    """``generate_stream`` connections that record Triton's answer to each model and streaming
    mode, then replay it to every later request of that kind once ``replaying`` is set. Each
    call has a connection of its own, none kept alive or opened ahead: a replayed request
    dials nothing."""

    def __init__(self) -> None:
        super().__init__(keep_alive_s=0)
        self.tapes: dict[tuple[bytes, bool], list[bytes]] = {}
        self.replaying = False

    def take_ready(self, url: str) -> Connection | None:
        return None

    async def open(self, url: str) -> Connection:
        real = None
        if not self.replaying:
            real = await super().open(url)
            self._open.discard(real[1])
        wire = _Wire(self.tapes, self.replaying, real)
        self._open.add(wire)  # type: ignore[arg-type]
        return wire, wire  # type: ignore[return-value]


class ReplayingTritonBackend(TritonBackend):
    """The Triton backend, each call recorded once per model and streaming mode, then replayed
    once ``replaying`` is set: the Triton path without a Triton server, decoding included."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded: dict[tuple[str, bytes], list[Any]] = {}
        self._http: ReplayingHttpStreams = ReplayingHttpStreams()

    @property
    def replaying(self) -> bool:
        return self._http.replaying

    @replaying.setter
    def replaying(self, value: bool) -> None:
        self._http.replaying = value

    def _open(
        self, url: str, request: Any, timeout: float, metadata: Mapping[str, str] | None = None
    ) -> Any:
        streaming = {"stream", "streaming"}
        flags = b"".join(
            raw
            for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True)
            if tensor.name in streaming
        )
        key = (request.model_name, flags)
        if self.replaying:
            return _Replay(self.recorded[key])
        self.recorded[key] = []
        return _Recording(super()._open(url, request, timeout, metadata), self.recorded[key])
