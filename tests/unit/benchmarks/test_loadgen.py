"""The load generator's account of a stream that never ends (how far it came, and its id), and
its marks of direct Triton's requests."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from tests.benchmarks.loadgen import DirectMarks, HttpClient, Sample, run_level

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


def test_direct_requests_are_named_one_by_one_and_marked(tmp_path: Path) -> None:
    marks = DirectMarks(
        str(tmp_path), "/v2/models/m/generate_stream", "h", 9, "k", {"input_ids": [1]}
    )
    # Every client of a process names its requests apart from the others'.
    other = DirectMarks(
        str(tmp_path), "/v2/models/m/generate_stream", "h", 9, "k", {"input_ids": [1]}
    )
    requests = [marks.request(), other.request(), marks.request()]
    heads, bodies = zip(*(r.split(b"\r\n\r\n", 1) for r in requests), strict=True)
    ids = [json.loads(body)["id"] for body in bodies]
    assert len(set(ids)) == 3 and all(i.startswith(f"direct-{os.getpid()}.") for i in ids)
    assert all(json.loads(body)["input_ids"] == [1] for body in bodies)
    assert all(
        f"Content-Length: {len(b)}".encode() in h for h, b in zip(heads, bodies, strict=True)
    )
    # The last request: written, its first token read, ended; one without a token is not kept.
    marks.written()
    marks.arrived()
    marks.ended(Sample(start=0.0))
    marks.request()
    marks.written()
    marks.ended(Sample(start=0.0))
    lines = [
        json.loads(line)
        for line in (tmp_path / f"direct-{os.getpid()}.jsonl").read_text().splitlines()
    ]
    assert [line["triton_id"] for line in lines] == [ids[2]]
    assert lines[0]["triton.written"] <= lines[0]["triton.arrived"]
