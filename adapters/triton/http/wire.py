"""What goes over the wire of Triton's HTTP ``generate_stream``: the JSON request and its bytes,
the chunked server-sent events of the answer, an answer's head and an error's text.

Why it is written here rather than taken from httpx: the client it serves cost 7.0 to 25.9 µs of
CPU per streamed token where httpx cost 38.8 to 116.0 (``python -m tests.benchmarks.transports``,
2 cores; docs/results/http-client.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import SplitResult, urlsplit

import msgspec

from adapters.triton.responses import Reply
from adapters.triton.wire import JsonOutputs, WireTensor

_JSON_TYPES = frozenset({"BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32",
                         "UINT64", "FP32", "FP64", "BYTES"})  # fmt: skip
_decoder = msgspec.json.Decoder(dict[str, Any])
_encoder = msgspec.json.Encoder()


def carries(tensors: Sequence[WireTensor]) -> bool:
    """Whether JSON can carry every input: not 16-bit floats (LoRA weights), and no more than one
    dimension besides the batch (Triton's ``generate`` reads a JSON list as one dimension, so
    stop and bad word lists, ``[1, 2, N]``, cannot go that way)."""
    return all(tensor.datatype in _JSON_TYPES and tensor.ndim <= 2 for tensor in tensors)


def generate_body(
    request_id: str,
    tensors: Sequence[WireTensor],
    *,
    priority: int = 0,
    request_type: str | None = None,
) -> bytes:
    """A ``generate_stream`` request: each input without its batch dimension."""
    body: dict[str, Any] = {"id": request_id}
    for tensor in tensors:
        body[tensor.name] = tensor.json_value()
    parameters: dict[str, Any] = {}
    if priority > 0:
        parameters["priority"] = priority
    if request_type is not None:
        parameters["request_type"] = request_type
    if parameters:
        body["parameters"] = parameters
    return _encoder.encode(body)


def reply_of(event: bytes) -> Reply:
    """One event's outputs, read as arrays shaped as the gRPC responses' (batch and beam dims)."""
    data = _decoder.decode(event)
    error = data.pop("error", None)
    if error is not None:
        return Reply({}, error=str(error))
    for name in ("id", "model_name", "model_version"):
        data.pop(name, None)
    return Reply(JsonOutputs(data))


class ChunkedEvents:
    """Server-sent events out of a chunked HTTP body, whatever the pieces it arrives in."""

    def __init__(self) -> None:
        self._raw = b""
        self._text = b""
        self._events: list[bytes] = []
        self.ended = False

    def feed(self, data: bytes) -> None:
        """Add received bytes; complete chunks become events."""
        raw = self._raw + data if self._raw else data
        at = 0
        while not self.ended:
            line_end = raw.find(b"\r\n", at)
            if line_end < 0:
                break
            extension = raw.find(b";", at, line_end)
            size = int(raw[at : line_end if extension < 0 else extension], 16)
            end = line_end + 2 + size + 2
            if len(raw) < end:
                break
            payload = raw[line_end + 2 : end - 2]
            at = end
            self.ended = size == 0
            text = self._text + payload if self._text else payload
            if b"\n\n" not in text:
                self._text = text
                continue
            *events, self._text = text.split(b"\n\n")
            self._events.extend(event.removeprefix(b"data: ") for event in events if event)
        self._raw = raw[at:]

    @property
    def whole(self) -> bool:
        """Whether the body ended with nothing after it (its connection can carry another)."""
        return self.ended and not self._raw and not self._text

    def take(self) -> list[bytes]:
        """The events completed so far, each once."""
        events, self._events = self._events, []
        return events


def split_url(url: str) -> SplitResult:
    """``url`` with or without its scheme."""
    return urlsplit(url if "//" in url else f"http://{url}")


def request_bytes(url: str, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    host = split_url(url).netloc
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def error_text(reader: asyncio.StreamReader, headers: Mapping[bytes, bytes]) -> str:
    """The message of an error answer (Triton's ``{"error": "..."}``)."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        parts = []
        while size := int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16):
            parts.append((await reader.readexactly(size + 2))[:-2])
        body = b"".join(parts)
    else:
        body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
    try:
        return str(_decoder.decode(body).get("error", body.decode(errors="replace")))
    except msgspec.DecodeError:
        return body.decode(errors="replace")
