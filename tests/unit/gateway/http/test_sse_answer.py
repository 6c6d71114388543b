"""The SSE answer's writes: each batch of chunks framed into one body message, ``[DONE]`` last,
a failure mid-stream an in-band error event, and the close hook run once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import msgspec

from gateway.errors import ErrorEnvelope
from gateway.http.answers import stream_response


class Piece(msgspec.Struct):
    text: str


async def _batches(
    batches: list[list[Piece]], fail: bool = False
) -> AsyncGenerator[Sequence[msgspec.Struct], None]:
    for batch in batches:
        yield batch
    if fail:
        raise RuntimeError("the engine went away")


async def _answer(batches: list[list[Piece]], fail: bool = False) -> tuple[list[Any], int]:
    closed = 0

    async def on_close() -> None:
        nonlocal closed
        closed += 1

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client never leaves
        return {"type": "http.disconnect"}

    sent: list[Any] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    stream = await stream_response(
        receive, _batches(batches, fail), retry_after_s=1, on_close=on_close
    )
    await stream({"type": "http"}, receive, send)
    return sent, closed


async def test_every_batch_is_one_write_and_done_comes_last() -> None:
    sent, closed = await _answer([[Piece("a"), Piece("b")], [Piece("c")]])
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    bodies = [message["body"] for message in sent[1:]]
    assert bodies == [
        b'data: {"text":"a"}\n\ndata: {"text":"b"}\n\n',
        b'data: {"text":"c"}\n\n',
        b"data: [DONE]\n\n",
    ]
    assert [message["more_body"] for message in sent[1:]] == [True, True, False]
    assert closed == 1


async def test_a_failure_after_the_first_batch_is_an_error_event() -> None:
    sent, closed = await _answer([[Piece("a")]], fail=True)
    bodies = [message["body"] for message in sent[1:]]
    assert bodies[0] == b'data: {"text":"a"}\n\n'
    error = msgspec.json.decode(bodies[1].removeprefix(b"data: "), type=ErrorEnvelope)
    assert error.error.type == "server_error"
    assert bodies[-1] == b"data: [DONE]\n\n"
    assert closed == 1
