"""``server.workers``: several gateway processes on one port, as one gateway.

One sidecar (the paced load-test engine, so streams last a known time) is supervised by the
parent; the workers share the port, the limits (an embedded Redis, or the configured one), the
admin API's changes, run-time LoRA adapters and the metrics; SIGTERM drains them all.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from deploy.sidecar.frontend import keeper
from gateway.tenancy.service import digest, new_key
from tests.support.gateway import serve_process, stop_process
from tests.support.prometheus import scrape_until, total
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow
WORKERS = 3
ADMIN = new_key()
KEY = new_key()
READER = new_key()
"""The key of ``reader``, a tenant without limits that the limit's test does not spend."""


@dataclass
class Gateway:
    url: str
    process: subprocess.Popen[bytes]
    store: str
    """``embedded`` (the gateway runs its own Redis) or ``configured``."""
    workdir: Path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def workers(self) -> list[psutil.Process]:
        """The worker processes (not the multiprocessing resource tracker, nor the sidecar)."""
        children = psutil.Process(self.process.pid).children()
        return [c for c in children if "spawn_main" in " ".join(c.cmdline())]


def _config(model_dir: Path, store: dict[str, Any] | None) -> dict[str, Any]:
    engine = {"kind": "loadtest", "tokenizer_dir": str(model_dir), "token_s": 0.01}
    tenancy: dict[str, Any] = {
        "admin_key_sha256": digest(ADMIN),
        "tenants": [
            {"name": "team", "models": ["lt"], "requests_per_minute": 12},
            {"name": "reader", "models": ["lt"]},
        ],
        "keys": [
            {"tenant": "team", "sha256": digest(KEY)},
            {"tenant": "reader", "sha256": digest(READER)},
        ],
    }
    if store is not None:
        tenancy["store"] = store
    return {
        "sidecars": {"inline": {"models": [{"name": "lt", "engine": engine}]}},
        "models": [{"name": "lt", "pipeline": "lt", "entry": "tensorrt_llm"}],
        "tenancy": tenancy,
        "server": {"workers": WORKERS},
        "limits": {"drain_delay_s": 1.0, "shutdown_grace_s": 30.0},
    }


@pytest.fixture(scope="module", params=["embedded", "configured"])
def gateway(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    redis = RedisServer().start() if request.param == "configured" else None
    store = {"kind": "redis", "url": redis.url} if redis is not None else None
    workdir = tmp_path_factory.mktemp(f"workers-{request.param}")
    url, process = serve_process(_config(tiny_model_dir, store), workdir, "workers", 120)
    try:
        yield Gateway(url, process, request.param, workdir)
    finally:
        if process.poll() is None:
            stop_process(process)
        if redis is not None:
            redis.stop()


def _fresh(gateway: Gateway, method: str, path: str, key: str = KEY, **kwargs: Any) -> Any:
    """One request on a connection of its own (the kernel picks the worker)."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(timeout=30) as client:
        return client.request(method, f"{gateway.url}{path}", headers=headers, **kwargs)


def test_the_port_is_served_by_every_worker(gateway: Gateway) -> None:
    python = gateway.workers()
    assert len(python) == WORKERS

    async def hold() -> set[int]:
        clients = [httpx.AsyncClient(timeout=30) for _ in range(24)]
        try:
            await asyncio.gather(*(c.get(f"{gateway.url}/health/live") for c in clients))
            serving = set()
            for worker in python:
                ports = [c.laddr.port for c in worker.net_connections("tcp") if c.raddr]
                if gateway.port in ports:
                    serving.add(worker.pid)
            return serving
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))

    assert len(asyncio.run(hold())) >= 2, "connections spread over the workers"


def test_a_tenant_limit_holds_across_workers(gateway: Gateway) -> None:
    body = {"model": "lt", "prompt": "hello there", "max_tokens": 1}
    codes = [_fresh(gateway, "POST", "/v1/completions", json=body).status_code for _ in range(24)]
    # 12 a minute with the default burst: 12 at once, then one each 5 s. Counted per process,
    # the 24 requests spread over 3 workers would get up to 24 through.
    assert 12 <= codes.count(200) <= 13
    assert set(codes) == {200, 429}


def test_an_admin_change_reaches_every_worker(gateway: Gateway) -> None:
    patched = _fresh(
        gateway, "PATCH", "/admin/tenants/team", key=ADMIN, json={"models": ["nothing"]}
    )
    assert patched.status_code == 200
    _on_every_worker(lambda: _fresh(gateway, "GET", "/v1/models").json()["data"] == [])
    restored = _fresh(gateway, "PATCH", "/admin/tenants/team", key=ADMIN, json={"models": ["lt"]})
    assert restored.status_code == 200


def test_a_lora_load_reaches_every_worker(gateway: Gateway, adapters: dict[str, Path]) -> None:
    load = {"lora_name": "run-time", "lora_path": str(adapters["lora-a"]), "base_model": "lt"}
    answer = _fresh(gateway, "POST", "/v1/load_lora_adapter", key=ADMIN, json=load)
    assert answer.status_code == 200, answer.text

    def served() -> set[str]:
        return {m["id"] for m in _fresh(gateway, "GET", "/v1/models", key=ADMIN).json()["data"]}

    _on_every_worker(lambda: "run-time" in served())
    unload = {"lora_name": "run-time"}
    assert _fresh(gateway, "POST", "/v1/unload_lora_adapter", key=ADMIN, json=unload).is_success
    _on_every_worker(lambda: "run-time" not in served())


def test_workers_stream_over_the_http_of_a_sidecar_with_the_response_keeper(
    gateway: Gateway,
) -> None:
    if keeper.compiler() is None:
        pytest.skip("no C compiler on this host: sidecars run without the response keeper")
    (server,) = [c for c in psutil.Process(gateway.process.pid).children() if _is_triton(c)]
    assert any("keep-responses" in m.path for m in server.memory_maps())
    flags = dict(arg.split("=", 1) for arg in server.cmdline() if arg.startswith("--"))
    http_port, grpc_port = int(flags["--http-port"]), int(flags["--grpc-port"])
    log = (gateway.workdir / "workers.log").read_text()
    said = "model lt reaches Triton over http: its sidecars' tritonservers run the response keeper"
    assert said in log
    body = {"model": "lt", "prompt": "hello", "max_tokens": 200, "stream": True}
    headers = {"Authorization": f"Bearer {ADMIN}"}

    async def peers_while_streaming() -> set[int]:
        async with (
            httpx.AsyncClient(timeout=30) as client,
            client.stream(
                "POST", f"{gateway.url}/v1/completions", json=body, headers=headers
            ) as answer,
        ):
            lines = answer.aiter_lines()
            await anext(lines)
            ports = {
                c.raddr.port
                for worker in gateway.workers()
                for c in worker.net_connections("tcp")
                if c.raddr and c.status == psutil.CONN_ESTABLISHED
            }
            async for _ in lines:
                pass
        return ports

    peers = asyncio.run(peers_while_streaming())
    assert http_port in peers, (peers, http_port, grpc_port)


def _is_triton(process: psutil.Process) -> bool:
    return "tritonserver" in " ".join(process.cmdline())


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_metrics_count_the_requests_of_every_worker(gateway: Gateway) -> None:
    live = {"method": "GET", "route": "/health/live", "status": "200"}
    before = total(
        _fresh(gateway, "GET", "/metrics", key=ADMIN).text, "gateway_requests_total", **live
    )
    for _ in range(30):
        assert _fresh(gateway, "GET", "/health/live").status_code == 200
    _counted(gateway, "gateway_requests_total", live, before + 30)
    scraped = [
        total(_fresh(gateway, "GET", "/metrics", key=ADMIN).text, "gateway_requests_total", **live)
        - before
        for _ in range(6)
    ]
    assert scraped == [30.0] * 6, "every scrape, whichever worker answers, sums all workers"


def _on_every_worker(seen: Callable[[], bool]) -> None:
    """Until twelve requests in a row, each on a connection of its own, see a change: every
    worker polls the store every 0.25 s, later when the machine is busy."""
    deadline = time.monotonic() + 10
    while not all(seen() for _ in range(12)):
        assert time.monotonic() < deadline, "a worker never saw the change"
        time.sleep(0.1)


def _unlimited(gateway: Gateway) -> bool:
    """Whether a request of the tenant, on a connection of its own, is answered with no
    requests limit in force."""
    body = {"model": "lt", "prompt": "hi", "max_tokens": 1}
    answer = _fresh(gateway, "POST", "/v1/completions", json=body)
    return bool(answer.status_code == 200 and "x-ratelimit-limit-requests" not in answer.headers)


def _counted(gateway: Gateway, family: str, labels: dict[str, str], expected: float) -> None:
    """Until a scrape, whichever worker answers it, shows ``expected``."""
    scrape_until(
        lambda: _fresh(gateway, "GET", "/metrics", key=ADMIN).text, family, expected, **labels
    )


def _text_pieces(gateway: Gateway) -> int:
    """One streamed completion on a connection of its own: its chunks that carry text."""
    body = {"model": "lt", "prompt": "Once upon", "max_tokens": 12, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    url = f"{gateway.url}/v1/completions"
    pieces = 0
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", url, json=body, headers=headers) as answer,
    ):
        assert answer.status_code == 200
        for line in answer.iter_lines():
            data = line.removeprefix("data: ")
            if line.startswith("data: ") and data != "[DONE]":
                pieces += any(choice["text"] for choice in json.loads(data)["choices"])
    return pieces


def test_token_gaps_of_every_worker_reach_the_metrics(gateway: Gateway) -> None:
    """Each worker counts its streams' token gaps in batches; each stream's are written when it
    ends, and a scrape sums every worker's."""
    # The tenant's 12 requests a minute are spent by the limit's test.
    patched = _fresh(
        gateway, "PATCH", "/admin/tenants/team", key=ADMIN, json={"requests_per_minute": None}
    )
    assert patched.status_code == 200
    _on_every_worker(lambda: _unlimited(gateway))
    family = "gateway_inter_token_latency_seconds_count"
    model = {"model": "lt", "adapter": "", "tenant": "team"}
    before = total(_fresh(gateway, "GET", "/metrics", key=ADMIN).text, family, **model)
    gaps = sum(_text_pieces(gateway) - 1 for _ in range(12))
    assert gaps > 0
    _counted(gateway, family, model, before + gaps)
    scraped = [
        total(_fresh(gateway, "GET", "/metrics", key=ADMIN).text, family, **model) - before
        for _ in range(6)
    ]
    assert scraped == [float(gaps)] * 6


def _dropped_stream(gateway: Gateway, request_id: str, read: int) -> int:
    """A stream the client hangs up on after ``read`` text pieces; the pieces it got."""
    body = {"model": "lt", "prompt": "Once upon", "max_tokens": 2000, "stream": True}
    headers = {"Authorization": f"Bearer {READER}", "X-Request-ID": request_id}
    pieces = 0
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{gateway.url}/v1/completions", json=body, headers=headers) as got,
    ):
        assert got.status_code == 200
        for line in got.iter_lines():
            if line.startswith("data: {"):
                pieces += any(choice["text"] for choice in json.loads(line[6:])["choices"])
            if pieces >= read:
                break
    return pieces


def _access_tokens(gateway: Gateway, request_id: str) -> dict[str, int]:
    """The token counts of the access line of ``request_id``, from whichever worker wrote it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        log = (gateway.workdir / "workers.log").read_text()
        for line in log.splitlines():
            if "gateway.access" in line and line.endswith(f"[{request_id}]"):
                fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
                return {k: int(fields[k]) for k in ("prompt_tokens", "completion_tokens")}
        time.sleep(0.1)
    raise AssertionError(f"no access line for {request_id}")


def test_a_dropped_stream_is_counted_by_every_measure_across_workers(gateway: Gateway) -> None:
    """The access line, the summed per-tenant token counters and the limiter's charge agree on
    a stream the client dropped after 50 tokens, whichever worker served it."""
    reader = {"tenant": "reader"}
    families = ("prompt_tokens", "completion_tokens", "tenant_tokens")
    scrape = _fresh(gateway, "GET", "/metrics", key=ADMIN).text
    before = {name: total(scrape, f"gateway_{name}_total", **reader) for name in families}
    request_id = f"dropped-{gateway.store}"
    sent = _dropped_stream(gateway, request_id, 50)
    _counted(gateway, "gateway_tenant_requests_in_flight", reader, 0)
    access = _access_tokens(gateway, request_id)
    assert access["completion_tokens"] >= sent >= 50
    assert access["prompt_tokens"] > 0
    for name in ("prompt_tokens", "completion_tokens"):
        _counted(gateway, f"gateway_{name}_total", reader, before[name] + access[name])
    charged = before["tenant_tokens"] + access["prompt_tokens"] + access["completion_tokens"]
    _counted(gateway, "gateway_tenant_tokens_total", reader, charged)


def test_a_killed_gateway_takes_its_workers_along(gateway: Gateway) -> None:
    """Killed outright, the parent passes no signal on: each worker and the sidecar get one
    from the kernel and exit. (The embedded Redis does the same: ``test_sidecar_orphans``.)"""
    if gateway.store != "configured":
        pytest.skip("the SIGTERM drain ends the embedded gateway's run")
    assert len(gateway.workers()) == WORKERS
    # The workers, the sidecar's tritonserver and its stubs, multiprocessing's tracker.
    children = psutil.Process(gateway.process.pid).children(recursive=True)
    gateway.process.send_signal(signal.SIGKILL)
    gateway.process.wait(10)
    deadline = time.monotonic() + 30
    while (left := [c.pid for c in children if _alive(c.pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], [psutil.Process(pid).cmdline() for pid in left if _alive(pid)]


def test_sigterm_drains_streams_on_every_worker(gateway: Gateway) -> None:
    if gateway.store != "embedded":
        pytest.skip("the configured gateway's run ended with its parent killed")
    body = {"model": "lt", "prompt": "hello", "max_tokens": 300, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    patched = _fresh(
        gateway, "PATCH", "/admin/tenants/team", key=ADMIN, json={"requests_per_minute": None}
    )
    assert patched.status_code == 200
    _on_every_worker(lambda: _unlimited(gateway))

    async def stream(client: httpx.AsyncClient, opened: asyncio.Queue[int]) -> dict[str, Any]:
        chunks: list[dict[str, Any]] = []
        done = False
        headers = {"Authorization": f"Bearer {KEY}"}
        async with client.stream(
            "POST", f"{gateway.url}/v1/completions", json=body, headers=headers
        ) as answer:
            async for line in answer.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunks.append(json.loads(line[6:]))
                    if len(chunks) == 1:
                        await opened.put(1)
        return {"status": answer.status_code, "chunks": chunks, "done": done}

    async def run() -> list[dict[str, Any]]:
        opened: asyncio.Queue[int] = asyncio.Queue()
        clients = [httpx.AsyncClient(timeout=60) for _ in range(9)]
        tasks = [asyncio.create_task(stream(c, opened)) for c in clients]
        for _ in tasks:
            await asyncio.wait_for(opened.get(), 30)
        serving = {
            w.pid
            for w in gateway.workers()
            if any(c.laddr.port == gateway.port and c.raddr for c in w.net_connections("tcp"))
        }
        assert len(serving) >= 2, "streams on several workers"
        children = {p.pid for p in psutil.Process(gateway.process.pid).children(recursive=True)}
        gateway.process.send_signal(signal.SIGTERM)
        results = await asyncio.gather(*tasks)
        await asyncio.gather(*(c.aclose() for c in clients))
        assert await asyncio.to_thread(gateway.process.wait, 60) == 0
        deadline = time.monotonic() + 10
        while (left := [pid for pid in children if _alive(pid)]) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert left == [], [psutil.Process(pid).cmdline() for pid in left if _alive(pid)]
        return results

    for result in asyncio.run(run()):
        assert result["status"] == 200 and result["done"]
        assert result["chunks"][-1]["usage"]["completion_tokens"] == 300
