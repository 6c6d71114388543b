"""Streamed completions read by ``curl -N`` processes: many long streams held open without
taking the test's own event loop, which stays free for the requests it times."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any


class CurlStreams:
    """``count`` streamed ``/v1/completions`` requests, each a ``curl -N`` writing to its file."""

    def __init__(self, url: str, body: dict[str, Any], count: int, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.files = [folder / f"stream-{index}.txt" for index in range(count)]
        command = ["curl", "-sN", "-w", "%{http_code}", "-H", "content-type: application/json",
                   "-d", json.dumps(body), f"{url}/v1/completions"]  # fmt: skip
        self.processes = [
            subprocess.Popen([*command, "-o", str(path)], stdout=subprocess.PIPE)
            for path in self.files
        ]

    async def started(self, timeout_s: float) -> None:
        """Until every stream has its first event."""
        deadline = time.monotonic() + timeout_s
        while not all(_first_event(path) for path in self.files):
            assert time.monotonic() < deadline, "the streams did not start"
            await asyncio.sleep(0.05)

    def done(self) -> list[bool]:
        """Which streams have ended."""
        return [process.poll() is not None for process in self.processes]

    async def results(self, timeout_s: float = 120.0) -> list[dict[str, Any]]:
        """Each stream's status, its events' data, and whether ``[DONE]`` ended it."""
        results = []
        for process, path in zip(self.processes, self.files, strict=True):
            stdout, _ = await asyncio.to_thread(process.communicate, timeout=timeout_s)
            events = [
                line.removeprefix("data: ")
                for line in path.read_text().splitlines()
                if line.startswith("data: ")
            ]
            done = bool(events) and events[-1] == "[DONE]"
            chunks = [json.loads(event) for event in events if event != "[DONE]"]
            results.append({"status": int(stdout or 0), "chunks": chunks, "done": done})
        return results

    def kill(self) -> None:
        """End every stream still open."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def _first_event(path: Path) -> bool:
    try:
        return b"data: " in path.read_bytes()
    except FileNotFoundError:
        return False
