"""Operations on ``triton-gateway serve`` supervising its sidecar: traces exported over OTLP and
joined by Triton's, Triton's metrics through the gateway, JSON logs, a killed sidecar, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from tests.support.curl_streams import CurlStreams
from tests.support.gateway import serve_process
from tests.support.prometheus import total

pytestmark = pytest.mark.slow
STREAMS = 16
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
Span = tuple[str, str, str, str, str]
"""trace id, span id, parent span id (hex), name, and who sent it (gateway or triton)."""


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver keeping every span it is sent."""

    spans: ClassVar[list[Span]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        found: list[Span] = []
        if self.headers.get("Content-Type") == "application/json":  # Triton's C++ exporter
            for resource in json.loads(body).get("resourceSpans", []):
                for scope in resource.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        found.append(
                            (
                                span["traceId"].lower(),
                                span["spanId"].lower(),
                                span.get("parentSpanId", "").lower(),
                                span["name"],
                                "triton",
                            )
                        )
        else:  # the gateway's, protobuf
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    for item in scope.spans:
                        found.append(
                            (
                                item.trace_id.hex(),
                                item.span_id.hex(),
                                item.parent_span_id.hex(),
                                item.name,
                                "gateway",
                            )
                        )
        type(self).spans.extend(found)
        self.send_response(200)
        self.send_header("Content-Type", self.headers.get("Content-Type", "application/json"))
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def collector() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    server.shutdown()


DRAIN_DELAY_S = 5.0
"""Long enough that a loaded machine's test still sends a request within it."""
DRAINED_TOKENS = 1000
DRAINED_TOKEN_S = 0.012
"""The drained streams come from a paced model: ``DRAINED_TOKENS`` of them take at least 12 s
however fast the host, so they outlast the drain delay and end during the drain."""
SPAN_QUEUE = (
    "bsp_max_queue_size=262144",
    "bsp_max_export_batch_size=4096",
    "bsp_schedule_delay=500",
)


def _config(model_dir: Path, collector: str, **limits: float) -> dict[str, Any]:
    trace_args = [
        "--trace-config=mode=opentelemetry",
        "--trace-config=rate=1",
        "--trace-config=level=TIMESTAMPS",
        f"--trace-config=opentelemetry,url={collector}",
        # Every streamed chunk through the ensemble adds spans: a queue that holds them all.
        *(f"--trace-config=opentelemetry,{setting}" for setting in SPAN_QUEUE),
    ]
    engine = {"kind": "torch", "model_dir": str(model_dir), "max_batch_size": 32}
    paced = {"kind": "loadtest", "tokenizer_dir": str(model_dir), "token_s": DRAINED_TOKEN_S}
    spec = {
        "models": [{"name": "ops", "engine": engine}, {"name": "drained", "engine": paced}],
        "sidecars": [{"name": "ops", "max_restarts": 3, "extra_args": trace_args}],
    }
    tracing = {"enabled": True, "endpoint": collector, "service_name": "gateway-under-test"}
    return {
        "sidecars": {"inline": spec},
        "tenancy": {"auth": False},
        "limits": {"retry_after_s": 3, **limits},
        "observability": {"log_format": "json", "tracing": tracing},
    }


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    pending = [pid]
    while pending:
        current = pending.pop()
        children: list[str] = []
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                children += (task / "children").read_text().split()
            except OSError:
                continue
        for child in map(int, children):
            found.add(child)
            pending.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _long_body(tokens: int, model: str = "ops") -> dict[str, Any]:
    """A streamed completion of exactly ``tokens`` tokens, its usage in the last chunk."""
    return {"model": model, "prompt": "def f(x):", "max_tokens": tokens, "min_tokens": tokens,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip


@pytest.fixture(scope="module")
def gateway(
    tiny_model_dir: Path, collector: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Any, Path]]:
    """``triton-gateway serve`` supervising its own sidecar; the last test stops it."""
    config = _config(tiny_model_dir, collector, drain_delay_s=DRAIN_DELAY_S, shutdown_grace_s=60)
    workdir = tmp_path_factory.mktemp("ops")
    config["sidecars"]["workdir"] = str(workdir / "sidecars")
    url, process = serve_process(config, workdir, "ops", timeout_s=120)
    yield url, process, workdir / "ops.log"
    if process.poll() is None:
        process.kill()


def _metric(url: str, family: str, **labels: str) -> float:
    return total(httpx.get(f"{url}/metrics").text, family, **labels)


def _tritonserver(pid: int) -> int:
    for child in _descendants(pid):
        try:
            if (
                Path(f"/proc/{child}/cmdline")
                .read_bytes()
                .split(b"\0")[0]
                .endswith(b"tritonserver")
            ):
                return child
        except OSError:
            continue
    raise AssertionError("no tritonserver under the gateway")


def test_triton_spans_join_the_gateways_trace(gateway: tuple[str, Any, Path]) -> None:
    url = gateway[0]
    headers = {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"}
    body = {"model": "ops", "prompt": "def f(x):", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as answer:
        assert answer.status_code == 200
        list(answer.iter_lines())
    deadline = time.monotonic() + 120
    ours: dict[str, tuple[str, str]] = {}
    parents: list[str] = []
    while time.monotonic() < deadline:
        spans = [span for span in _Collector.spans if span[0] == TRACE_ID]
        ours = {
            name: (span_id, parent)
            for _, span_id, parent, name, source in spans
            if source == "gateway"
        }
        parents = [parent for _, _, parent, _, source in spans if source == "triton"]
        if "triton.generate" in ours and ours["triton.generate"][0] in parents:
            break
        time.sleep(0.3)
    assert "POST /v1/completions" in ours, f"the gateway exported {sorted(ours)}"
    assert ours["POST /v1/completions"][1] == "00f067aa0ba902b7"  # under the client's span
    from_triton = sum(1 for span in _Collector.spans if span[4] == "triton")
    assert ours["triton.generate"][0] in parents, (
        f"Triton's spans are not under triton.generate: {parents} ({from_triton} from Triton)"
    )


def test_triton_metrics_and_sidecar_state_reach_the_gateway(
    gateway: tuple[str, Any, Path],
) -> None:
    url = gateway[0]
    triton = httpx.get(f"{url}/metrics/sidecars/ops")
    assert triton.status_code == 200
    assert 'nv_inference_request_success{model="ops_ensemble"' in triton.text
    missing = httpx.get(f"{url}/metrics/sidecars/nope")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "name"
    assert _metric(url, "gateway_sidecar_up", sidecar="ops") == 1
    assert _metric(url, "gateway_sidecar_restarts_total", sidecar="ops") == 0


def test_json_logs_carry_request_ids_and_no_prompts(gateway: tuple[str, Any, Path]) -> None:
    url, _, log = gateway
    body = {"model": "ops", "prompt": "secret words", "max_tokens": 2}
    answer = httpx.post(f"{url}/v1/completions", json=body, headers={"X-Request-ID": "json-1"})
    assert answer.status_code == 200
    time.sleep(0.3)
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    access = [
        e
        for e in entries
        if e.get("logger") == "gateway.access" and e.get("request_id") == "json-1"
    ]
    assert access and access[0]["status"] == 200 and access[0]["completion_tokens"] == 2
    assert not [e for e in entries if "secret words" in json.dumps(e)]


async def test_a_killed_sidecar_ends_its_streams_and_comes_back(
    gateway: tuple[str, Any, Path], tmp_path: Path
) -> None:
    url, process, _ = gateway
    streams = CurlStreams(url, _long_body(3000), STREAMS, tmp_path / "streams")
    try:
        await streams.started(60)
        os.kill(_tritonserver(process.pid), signal.SIGKILL)
        killed = time.monotonic()
        results = await streams.results(60)
    finally:
        streams.kill()
    assert time.monotonic() - killed < 30, "streams must end promptly"
    for result in results:
        assert result["status"] == 200 and result["done"]
        error = result["chunks"][-1]["error"]
        assert error["type"] == "server_error" and error["code"] == "backend_unavailable"

    async with httpx.AsyncClient(timeout=10) as client:
        assert (await client.get(f"{url}/health/ready")).status_code == 503
        deadline = time.monotonic() + 90
        while (await client.get(f"{url}/health/ready")).status_code != 200:
            assert time.monotonic() < deadline, "the sidecar did not come back"
            await asyncio.sleep(0.5)
        answer = await client.post(
            f"{url}/v1/completions", json={"model": "ops", "prompt": "x", "max_tokens": 3}
        )
    assert answer.status_code == 200
    assert _metric(url, "gateway_sidecar_restarts_total", sidecar="ops") == 1
    assert _metric(url, "gateway_sidecar_up", sidecar="ops") == 1
    assert _metric(url, "gateway_tenant_requests_in_flight", tenant="anonymous") == 0
    assert _metric(url, "gateway_requests_in_flight") == 1  # the scrape itself


async def test_sigterm_drains_sixteen_streams(
    gateway: tuple[str, Any, Path], tmp_path: Path
) -> None:
    url, process, log = gateway
    children = _descendants(process.pid)
    assert children, "the gateway runs its sidecar"
    # Read by curl processes, so this test's event loop times the drain's requests on time on a
    # busy machine.
    body = _long_body(DRAINED_TOKENS, model="drained")
    streams = CurlStreams(url, body, STREAMS, tmp_path / "streams")
    try:
        await streams.started(60)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        async with httpx.AsyncClient(timeout=10) as client:
            await asyncio.sleep(0.1)
            during_delay = await client.post(
                f"{url}/v1/completions", json={"model": "ops", "prompt": "x", "max_tokens": 2}
            )
            took = time.monotonic() - signalled
            # still served during the delay
            assert during_delay.status_code == 200, (took, during_delay.text)
            ready = await client.get(f"{url}/health/ready")
            assert ready.status_code == 503  # readiness off from the signal on
            deadline = time.monotonic() + 2 * DRAIN_DELAY_S + 10
            refused = during_delay
            while refused.status_code != 503 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                refused = await client.post(
                    f"{url}/v1/completions", json={"model": "ops", "prompt": "x", "max_tokens": 2}
                )
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "3"
            assert refused.json()["error"]["code"] == "shutting_down"
            assert not all(streams.done()), "the streams ended within the drain delay"
        results = await streams.results()
    finally:
        streams.kill()
    for result in results:
        assert result["status"] == 200 and result["done"]
        assert result["chunks"][-1]["usage"]["completion_tokens"] == DRAINED_TOKENS
        assert result["chunks"][-2]["choices"][0]["finish_reason"] == "length"
    assert await asyncio.to_thread(process.wait, 60) == 0
    time.sleep(0.5)
    assert not [pid for pid in children if _alive(pid)], "a sidecar process outlived the gateway"
    # The sidecar unloaded its models in time and no Python stub crashed on its way out.
    sidecar_log = (log.parent / "sidecars" / "ops.log").read_text(errors="replace")
    assert "dropping span" not in sidecar_log
    assert "successfully unloaded 'ops_tensorrt_llm'" in sidecar_log
    assert "successfully unloaded 'drained_tensorrt_llm'" in sidecar_log
    assert "Segfault" not in sidecar_log
    assert "ignored SIGTERM" not in log.read_text()
