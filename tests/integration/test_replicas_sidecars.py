"""A pipeline hosted by two supervised sidecars is one model with two replicas: the gateway
starts both, routes over both and names them in its metrics (zero-compute load-test engine)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.settings import LimitSettings, ModelSettings, Settings, SidecarSettings
from gateway.tenancy import TenancySettings
from tests.support.gateway import LiveGateway
from tests.support.replicas import served

pytestmark = pytest.mark.slow
ENGINE = "lt_tensorrt_llm"


@pytest.fixture(scope="module")
def gateway(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveGateway]:
    only_engine = ["--model-control-mode=explicit", f"--load-model={ENGINE}"]
    spec = {
        "models": [
            {
                "name": "lt",
                "release": "latest",
                "engine": {"kind": "loadtest", "tokenizer_dir": str(tiny_model_dir)},
            }
        ],
        "sidecars": [
            {"name": "gpu0", "extra_args": only_engine},
            {"name": "gpu1", "extra_args": only_engine},
        ],
    }
    settings = Settings(
        models=(ModelSettings(name="lt", pipeline="lt", entry="tensorrt_llm"),),
        sidecars=SidecarSettings(inline=spec, workdir=str(tmp_path_factory.mktemp("sidecars"))),
        limits=LimitSettings(request_timeout_s=30.0, shutdown_grace_s=2.0),
        tenancy=TenancySettings(auth=False),
    )
    live = LiveGateway(settings).start()
    try:
        live.wait_ready(timeout_s=90)
        yield live
    finally:
        live.stop()


async def test_both_sidecars_serve_the_model(gateway: LiveGateway) -> None:
    sidecars = {s.name: s for s in gateway.app.state.runtime.sidecars}
    assert sorted(sidecars) == ["gpu0", "gpu1"]
    body = {"model": "lt", "prompt": "river stone", "max_tokens": 4}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        answers = await asyncio.gather(
            *(client.post("/v1/completions", json=body) for _ in range(20))
        )
        metrics = (await client.get("/metrics")).text
    assert {a.status_code for a in answers} == {200}
    counts = {name: served(sidecar, ENGINE) for name, sidecar in sidecars.items()}
    assert sum(counts.values()) == 20 and min(counts.values()) >= 5, counts
    for name in sidecars:
        assert f'gateway_replica_up{{model="lt",replica="{name}"}} 1.0' in metrics
