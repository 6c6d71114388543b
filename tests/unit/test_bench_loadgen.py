"""The load generator's account of a stream that never ends: how far it came, and its id."""

from __future__ import annotations

import asyncio

from tests.benchmarks.loadgen import HttpClient, run_level

_CHUNK = b'data: {"choices":[{"text":"x","index":0}]}\n\n'


async def _stalling_server(tokens: int) -> tuple[asyncio.Server, int]:
    """An OpenAI-style stream that sends ``tokens`` chunks, then nothing more."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"x-request-id: 5eed\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for _ in range(tokens):
            writer.write(b"%x\r\n%s\r\n" % (len(_CHUNK), _CHUNK))
        await writer.drain()
        await asyncio.sleep(30)

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _one_stalled(tokens: int) -> str | None:
    server, port = await _stalling_server(tokens)
    async with server:

        async def connect() -> object:
            client = HttpClient("127.0.0.1", port, "/v1/completions", {"stream": True}, "k")
            return client.send

        samples, _ = await run_level(connect, 1, 0.05, request_timeout_s=0.3)  # type: ignore[arg-type]
    return samples[0].error


def test_a_stream_stalled_after_tokens_says_how_many_and_its_id() -> None:
    error = asyncio.run(_one_stalled(3))
    assert error is not None
    assert error.startswith("TimeoutError: no end in 0.3 s: 3 tokens, the last 0.")
    assert error.endswith("s before, x-request-id 5eed")


def test_a_stream_stalled_before_its_first_token_says_so() -> None:
    assert (
        asyncio.run(_one_stalled(0)) == "TimeoutError: no end in 0.3 s: no token, x-request-id 5eed"
    )
