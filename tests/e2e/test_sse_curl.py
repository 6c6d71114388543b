"""``curl -N`` streaming: the raw server-sent events, checked byte for byte."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from tests.support.gateway import (  # noqa: F401
    BLS_MODEL,
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    LiveGateway,
    gateway_url,
    sidecar_settings,
)
from tests.support.sidecars import QUICK_STOP

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("curl") is None, reason="needs the curl binary"),
]


def curl_stream(url: str, body: dict[str, Any]) -> tuple[list[str], bytes]:
    """Status line and headers, and the raw body, of a POST read with ``curl -N``."""
    command = ["curl", "-N", "-sS", "-i", "--max-time", "60"]
    command += ["-H", "Content-Type: application/json", "-d", json.dumps(body), url]
    done = subprocess.run(
        command,
        capture_output=True,
        check=True,
        timeout=90,
    )
    head, _, raw = done.stdout.partition(b"\r\n\r\n")
    return head.decode().lower().split("\r\n"), raw


def reframe(raw: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """The JSON events of an SSE body, and the exact bytes the gateway should have sent."""
    assert raw.endswith(b"data: [DONE]\n\n")
    events = [json.loads(part.removeprefix(b"data: ")) for part in raw.split(b"\n\n")[:-2]]
    expected = b"".join(
        b"data: " + json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
        for e in events
    )
    return events, expected + b"data: [DONE]\n\n"


@pytest.mark.parametrize("model", [ENSEMBLE_MODEL, BLS_MODEL, ENGINE_MODEL])
def test_chat_stream_framing(gateway_url: str, model: str) -> None:  # noqa: F811
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    head, raw = curl_stream(f"{gateway_url}/v1/chat/completions", body)
    assert head[0].startswith("http/1.1 200")
    assert "content-type: text/event-stream; charset=utf-8" in head
    assert "cache-control: no-cache" in head
    events, expected = reframe(raw)
    assert raw == expected
    assert [e["object"] for e in events] == ["chat.completion.chunk"] * len(events)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == []
    assert events[-1]["usage"]["completion_tokens"] == 6
    contents = [e["choices"][0]["delta"].get("content") for e in events[1:-2]]
    assert all(isinstance(c, str) for c in contents)


def test_completion_stream_framing(gateway_url: str) -> None:  # noqa: F811
    body = {"model": ENSEMBLE_MODEL, "prompt": "The cat", "max_tokens": 5, "stream": True}
    _, raw = curl_stream(f"{gateway_url}/v1/completions", body)
    events, expected = reframe(raw)
    assert raw == expected
    assert all(e["object"] == "text_completion" and "usage" not in e for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_errors_before_the_stream_are_plain_http_errors(gateway_url: str) -> None:  # noqa: F811
    body = {"model": "nope", "prompt": "x", "stream": True}
    head, raw = curl_stream(f"{gateway_url}/v1/completions", body)
    assert head[0].startswith("http/1.1 404")
    assert json.loads(raw)["error"]["code"] == "model_not_found"


PACED_BLS = "paced-bls"


@pytest.fixture(scope="module")
def paced_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sidecar]:
    """A pipeline whose engine streams a token every 10 ms, however fast the host."""
    paced = {"kind": "loadtest", "tokenizer_dir": str(tiny_model_dir), "token_s": 0.01}
    spec = parse_spec(
        {
            "models": [{"name": "paced", "release": "latest", "engine": paced}],
            "sidecars": [{"name": "paced", **QUICK_STOP}],
        }
    )
    server = sidecar_from_spec(spec, spec.sidecars[0], tmp_path_factory.mktemp("paced"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def impatient_gateway(paced_sidecar: Sidecar, tiny_model_dir: Path) -> Iterator[str]:
    """A gateway whose requests time out after one second, over the paced pipeline's BLS."""
    models = {PACED_BLS: ("paced_tensorrt_llm_bls", "tensorrt_llm_bls")}
    settings = sidecar_settings(paced_sidecar, tiny_model_dir, models=models, request_timeout_s=1.0)
    gateway = LiveGateway(settings)
    yield gateway.start().url
    gateway.stop()


def test_a_failure_mid_stream_is_an_in_band_error_then_done(impatient_gateway: str) -> None:
    # 20 s of tokens at the least: the one-second deadline passes mid-stream on any host.
    body = {"model": PACED_BLS, "prompt": "The cat", "max_tokens": 2000, "min_tokens": 2000}
    head, raw = curl_stream(f"{impatient_gateway}/v1/completions", {**body, "stream": True})
    assert head[0].startswith("http/1.1 200")
    events, expected = reframe(raw)
    assert raw == expected
    assert events[0]["object"] == "text_completion"
    assert set(events[-1]) == {"error"}
    assert events[-1]["error"]["code"] == "timeout"
    assert events[-1]["error"]["type"] == "server_error"
    head, raw = curl_stream(f"{impatient_gateway}/v1/completions", body)
    assert head[0].startswith("http/1.1 504")
    assert json.loads(raw)["error"]["code"] == "timeout"
