"""The floor of a Python hop, for the capacity benchmark: the least any gateway served this way
adds to Triton.

``--workers`` uvicorn processes (uvloop, httptools, one ``SO_REUSEPORT`` port: as the gateway
serves) pass every request on to Triton's HTTP ``generate_stream`` with the direct path's
prebuilt body, on a connection opened ahead, and relay Triton's events as they come. No auth, no
tokenizer, no request or event is parsed: what remains is the second pair of sockets and the
server's own work per request and per event.

    python -m tests.benchmarks.relay --triton 127.0.0.1:8000 --model m --body body.json \
        --port 9000 --workers 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from deploy.sidecar.ports import free_port
from deploy.sidecar.supervisor import Sidecar
from gateway.server import reuse_port_socket
from tests.support.gateway import stop_process

_HEAD = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Relay:
    """The ASGI app of one worker: ``GET /ready`` answers 200, any POST is relayed."""

    def __init__(self, triton: str, model: str, body: bytes) -> None:
        self._host, port = triton.rsplit(":", 1)
        self._port = int(port)
        self._request = (
            f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nHost: {triton}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self._spare: asyncio.Task[Connection] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["method"] == "GET":
            # Which worker answered: the bench waits until every one has.
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": str(os.getpid()).encode()})
            return
        while (await receive()).get("more_body"):
            pass
        reader, writer = await self._connection()
        try:
            writer.write(self._request)
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (ConnectionError, asyncio.IncompleteReadError):
                # The spare was closed by Triton meanwhile: once more on a new connection.
                writer.close()
                reader, writer = await asyncio.open_connection(self._host, self._port)
                writer.write(self._request)
                head = await reader.readuntil(b"\r\n\r\n")
            if head.split(b" ", 2)[1] != b"200":
                await send({"type": "http.response.start", "status": 502, "headers": _HEAD})
                await send({"type": "http.response.body", "body": head})
                return
            await self._relay(reader, send)
        finally:
            writer.close()

    async def _connection(self) -> Connection:
        """The connection opened ahead; the next one starts opening."""
        spare = self._spare
        self._spare = asyncio.ensure_future(asyncio.open_connection(self._host, self._port))
        if spare is not None:
            try:
                return await spare
            except OSError:
                pass
        return await asyncio.open_connection(self._host, self._port)

    @staticmethod
    async def _relay(reader: asyncio.StreamReader, send: Any) -> None:
        """Each chunk of Triton's chunked body as one chunk of the answer."""
        started = False
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            data = (await reader.readexactly(size + 2))[:-2]
            if not started:
                await send({"type": "http.response.start", "status": 200, "headers": _HEAD})
                started = True
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await reader.readexactly(2)
        if not started:
            await send({"type": "http.response.start", "status": 200, "headers": _HEAD})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@contextlib.contextmanager
def relay_process(
    sidecar: Sidecar, model: str, body: dict[str, Any], workdir: Path, workers: int
) -> Iterator[tuple[str, int]]:
    """The relay with ``workers`` workers in front of the sidecar's ``model``, once every
    worker listens: its URL and process id."""
    body_path = workdir / "relay-body.json"
    body_path.write_text(json.dumps(body))
    port = free_port()
    triton = sidecar.http_url.removeprefix("http://")
    command = [sys.executable, "-m", "tests.benchmarks.relay", "--triton", triton, "--model",
               model, "--body", str(body_path), "--port", str(port), "--workers",
               str(workers)]  # fmt: skip
    with (workdir / f"relay-{workers}.log").open("wb") as log:
        # A session of its own: the workers go with it even if the parent hangs.
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        answered: set[str] = set()
        # Every worker listening: each new connection lands on one, as the kernel spreads them.
        while len(answered) < workers:
            if process.poll() is not None or time.monotonic() > deadline:
                log_text = (workdir / f"relay-{workers}.log").read_text(errors="replace")
                raise RuntimeError(f"the relay did not start: {log_text}")
            answer = _answer(f"{url}/ready")
            if answer is None:
                time.sleep(0.2)
            else:
                answered.add(answer)
        yield url, process.pid
    finally:
        stop_process(process, 15, group=True)


def _answer(url: str) -> str | None:
    """The body of a 200 answer on a new connection, or None."""
    try:
        answer = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None
    return answer.text if answer.status_code == 200 else None


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        else:
            await send({"type": "lifespan.shutdown.complete"})
            return


def _worker(triton: str, model: str, body: bytes, port: int) -> None:
    config = uvicorn.Config(
        Relay(triton, model, body),
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )
    uvicorn.Server(config).run(sockets=[reuse_port_socket("127.0.0.1", port)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--triton", required=True, help="Triton's HTTP host:port")
    parser.add_argument("--model", required=True)
    parser.add_argument("--body", type=Path, required=True, help="the generate_stream body")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    body = args.body.read_bytes()
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_worker, args=(args.triton, args.model, body, args.port))
        for _ in range(args.workers)
    ]
    # SIGTERM stops every worker started (uvicorn exits on it), then this process.
    signal.signal(signal.SIGTERM, lambda *_: [w.terminate() for w in workers if w.pid])
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main()
