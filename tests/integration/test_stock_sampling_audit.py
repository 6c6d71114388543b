"""What reaches the engine: every sampling field the gateway sends, through each release's stock
ensemble and BLS, arrives at ``tensorrt_llm`` with its value, or the request is a 400 naming it.

Behind the stock models runs the load-test engine that writes down each request's inputs
(``tests/recording_engine.py``), so this checks the stock Python models' real forwarding, not a
table of what they are believed to forward. The v0.11.0 BLS does not load on Python 3.11; its
config is checked in ``tests/unit/adapters/triton/test_tensors.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.support import REPO
from tests.support.gateway import LiveGateway
from tests.support.stock import BLS_LOADS, STOCK_MODELS, start_stock_sidecar

pytestmark = pytest.mark.slow

RECORDING_ENGINE = REPO / "tests" / "support" / "recording_engine.py"
RELEASES = ("v0.8", "v0.11", "v0.19")
# A value of every sampling field, none of them the engine's default, and the engine inputs
# that must carry it (older releases use the second name).
SAMPLED: dict[str, Any] = {
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 7,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.25,
    "repetition_penalty": 1.25,
    "min_tokens": 2,
    "seed": 1234,
}
ENGINE_INPUTS: dict[str, tuple[str, ...]] = {
    "temperature": ("temperature",),
    "top_p": ("runtime_top_p",),
    "top_k": ("runtime_top_k",),
    "presence_penalty": ("presence_penalty",),
    "frequency_penalty": ("frequency_penalty",),
    "repetition_penalty": ("repetition_penalty",),
    "min_tokens": ("min_tokens", "min_length"),
    "seed": ("seed", "random_seed"),
}


def received(engine_dir: Path) -> list[dict[str, Any]]:
    """The inputs of every request the recording engine in ``engine_dir`` got, oldest first."""
    path = engine_dir / "received.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["inputs"] for line in path.read_text().splitlines() if line]


@dataclass
class Recorder:
    """A release's stock models over the recording engine, the gateway in front."""

    release: str
    engine_dir: Path
    client: openai.OpenAI

    def engine_inputs(self, entry: str, **params: Any) -> dict[str, Any]:
        """Send one completion through ``entry`` and return what the engine got for it."""
        before = len(received(self.engine_dir))
        self.client.completions.create(model=entry, prompt="Once upon a time", **params)
        requests = [r for r in received(self.engine_dir)[before:] if not r.get("stop")]
        assert len(requests) == 1, requests
        return {name: _scalar(value) for name, value in requests[0].items()}


def _scalar(value: Any) -> Any:
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value


@pytest.fixture(scope="module", params=RELEASES)
def recorder(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    text_env: Path,
) -> Iterator[Recorder]:
    if not STOCK_MODELS.is_dir():
        pytest.skip(f"the stock models are not beside the checkout ({STOCK_MODELS})")
    release = request.param
    workdir = tmp_path_factory.mktemp(f"audit-{release}")
    sidecar = start_stock_sidecar(
        release, True, tiny_model_dir, workdir, RECORDING_ENGINE, text_env=text_env
    )

    def model(name: str, entry: str) -> ModelSettings:
        return ModelSettings(
            name=name,
            triton_url=sidecar.grpc_url,
            triton_model=name,
            entry=entry,  # type: ignore[arg-type]
            tokenizer_dir=str(tiny_model_dir),
        )

    models = [model("ensemble", "ensemble")]
    if BLS_LOADS[release]:
        models.append(model("tensorrt_llm_bls", "tensorrt_llm_bls"))
    settings = Settings(
        models=tuple(models),
        limits=LimitSettings(request_timeout_s=60.0, shutdown_grace_s=5.0),
        tenancy=TenancySettings(auth=False),
    )
    gateway = LiveGateway(settings).start()
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    try:
        yield Recorder(release, workdir / "repo" / "tensorrt_llm", client)
    finally:
        client.close()
        gateway.stop()
        sidecar.stop()


def _entries(recorder: Recorder) -> list[str]:
    return ["ensemble", "tensorrt_llm_bls"] if BLS_LOADS[recorder.release] else ["ensemble"]


def _arrived(inputs: dict[str, Any], field: str) -> Any:
    for name in ENGINE_INPUTS[field]:
        if name in inputs:
            return inputs[name]
    return None


def test_every_sampling_field_arrives_or_is_refused_by_name(recorder: Recorder) -> None:
    openai_fields = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "seed")
    for entry in _entries(recorder):
        extra = {k: v for k, v in SAMPLED.items() if k in openai_fields}
        body = {k: v for k, v in SAMPLED.items() if k not in openai_fields}
        try:
            inputs = recorder.engine_inputs(entry, max_tokens=4, extra_body=body, **extra)
        except openai.BadRequestError as refused:
            # Only what the entry drops may be refused, and the refusal names it.
            error = refused.body
            assert isinstance(error, dict) and error["param"] == "temperature", error
            assert "is not supported by this model" in error["message"]
            extra.pop("temperature")
            inputs = recorder.engine_inputs(entry, max_tokens=4, extra_body=body, **extra)
            dropped = {"temperature"}
        else:
            dropped = set()
        for field, value in SAMPLED.items():
            if field not in dropped:
                assert _arrived(inputs, field) == pytest.approx(value), (entry, field, inputs)


def test_temperature_zero_arrives_as_greedy_everywhere(recorder: Recorder) -> None:
    for entry in _entries(recorder):
        inputs = recorder.engine_inputs(entry, max_tokens=4, temperature=0.0)
        assert inputs["runtime_top_k"] == 1, (entry, inputs)
        assert inputs.get("temperature", 0.0) == 0.0
