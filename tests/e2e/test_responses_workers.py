"""``server.workers: 2``: a conversation stored by one worker is continued on the other, through
the embedded store, with the openai SDK."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from gateway.tenancy.service import digest, new_key
from tests.support.gateway import serve_process, stop_process

pytestmark = pytest.mark.slow
KEY = new_key()


def _config(model_dir: Path) -> dict[str, Any]:
    engine = {"kind": "loadtest", "tokenizer_dir": str(model_dir), "token_s": 0.001}
    return {
        "sidecars": {"inline": {"models": [{"name": "lt", "engine": engine}]}},
        "models": [{"name": "lt", "pipeline": "lt", "entry": "tensorrt_llm"}],
        "tenancy": {
            "tenants": [{"name": "team", "models": ["lt"]}],
            "keys": [{"tenant": "team", "sha256": digest(KEY)}],
        },
        "server": {"workers": 2},
    }


@pytest.fixture(scope="module")
def served(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, psutil.Process]]:
    workdir = tmp_path_factory.mktemp("responses-workers")
    url, process = serve_process(_config(tiny_model_dir), workdir, "workers", 120)
    try:
        yield url, psutil.Process(process.pid)
    finally:
        if process.poll() is None:
            stop_process(process)


def _worker_of(parent: psutil.Process, port: int, local_port: int) -> int | None:
    """The worker holding the gateway's end of the connection from ``local_port``."""
    for child in parent.children():
        for connection in child.net_connections("tcp"):
            if (
                connection.laddr.port == port
                and connection.raddr
                and (connection.raddr.port == local_port)
            ):
                return child.pid
    return None


def _clients_on_two_workers(url: str, parent: psutil.Process) -> list[openai.OpenAI]:
    """Two SDK clients whose kept-alive connections two different workers serve."""
    port = int(url.rsplit(":", 1)[1])
    mine = psutil.Process()
    by_worker: dict[int, openai.OpenAI] = {}
    for _ in range(32):
        before = {c.laddr.port for c in mine.net_connections("tcp") if c.raddr}
        http = httpx.Client(timeout=60)
        http.get(f"{url}/health/live")
        after = {
            c.laddr.port for c in mine.net_connections("tcp") if c.raddr and c.raddr.port == port
        }
        (local,) = after - before
        worker = _worker_of(parent, port, local)
        if worker is not None and worker not in by_worker:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, http_client=http)
            by_worker[worker] = client
        else:
            http.close()
        if len(by_worker) == 2:
            return list(by_worker.values())
    raise AssertionError("the kernel gave every connection to one worker")


def test_a_conversation_goes_on_across_workers(served: tuple[str, psutil.Process]) -> None:
    first, second = _clients_on_two_workers(*served)
    made = first.responses.create(model="lt", input="Hello", max_output_tokens=4)
    assert made.usage is not None
    turns = [made]
    for client in (second, first, second):
        last = turns[-1]
        turns.append(
            client.responses.create(
                model="lt", input="Go on.", previous_response_id=last.id, max_output_tokens=4
            )
        )
    inputs = [turn.usage.input_tokens for turn in turns if turn.usage is not None]
    # Each turn's prompt holds the one before it, its answer and the new input.
    assert all(later > earlier + 4 for earlier, later in itertools.pairwise(inputs))
    assert second.responses.retrieve(made.id).output_text == made.output_text
    items = first.responses.input_items.list(turns[-1].id).data
    assert [item.type for item in items] == ["message"]
