"""A gateway started from a deploy spec with a context sidecar and a generation sidecar (two
real tritonservers it supervises, the tiny model's torch engine on the CPU): a split model's
answer is the answer of the same pipeline run whole, the generation sidecar taking the prompt's
KV cache from the context sidecar."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import openai
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.queueing.settings import QueueSettings
from gateway.replicas.settings import DisaggregationSettings
from gateway.settings import LimitSettings, ModelSettings, Settings, SidecarSettings
from gateway.tenancy import TenancySettings
from tests.integration.test_disaggregated_backend import ENGINE, PROMPT
from tests.support.gateway import LiveGateway
from tests.support.prometheus import value
from tests.support.replica_gateway import FAST
from tests.support.sidecars import QUICK_STOP

pytestmark = pytest.mark.slow

DISAGG = "nv_trt_llm_disaggregated_serving_metrics"
ONLY_ENGINE = ["--model-control-mode=explicit", f"--load-model={ENGINE}"]


@pytest.fixture(scope="module")
def gateway(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveGateway]:
    engine = {
        "kind": "torch",
        "model_dir": str(tiny_model_dir),
        "max_batch_size": 4,
        "tokens_per_block": 16,
        "guided_decoding": False,
    }
    sidecar = {"keep_responses": False, "extra_args": ONLY_ENGINE, **QUICK_STOP}
    spec = {
        "models": [{"name": "tiny", "release": "latest", "engine": engine}],
        "sidecars": [
            {
                "name": "ctx",
                "disaggregation": {"phase": "context", "kv_transfer_timeout_ms": 60000},
                **sidecar,
            },
            {"name": "gen", "disaggregation": {"phase": "generation"}, **sidecar},
        ],
    }

    def model(name: str, **routing: object) -> ModelSettings:
        return ModelSettings(
            name=name,
            pipeline="tiny",
            entry="tensorrt_llm",
            routing=msgspec.structs.replace(FAST, **routing),
        )

    split = DisaggregationSettings(min_prompt_tokens=32)
    settings = Settings(
        models=(model("tiny-whole"), model("tiny-split", disaggregation=split)),
        sidecars=SidecarSettings(inline=spec, workdir=str(tmp_path_factory.mktemp("split"))),
        limits=LimitSettings(request_timeout_s=60.0, shutdown_grace_s=2.0),
        tenancy=TenancySettings(auth=False),
        queueing=QueueSettings(enabled=False),
    )
    live = LiveGateway(settings).start()
    try:
        live.wait_ready(timeout_s=120)
        yield live
    finally:
        live.stop()


def _handoffs(sidecar: Sidecar) -> float:
    text = httpx.get(sidecar.metrics_url, timeout=10).text
    return value(text, DISAGG, model=ENGINE, disaggregated_serving_type="request_count")


def _answer(client: openai.OpenAI, model: str, stream: bool) -> str:
    if stream:
        pieces = client.completions.create(
            model=model, prompt=PROMPT, max_tokens=12, temperature=0, stream=True
        )
        return "".join(piece.choices[0].text for piece in pieces if piece.choices)
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    return whole.choices[0].text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_split_answer_of_supervised_sidecars_is_the_whole_answer(
    gateway: LiveGateway, stream: bool
) -> None:
    sidecars = {s.name: s for s in gateway.app.state.runtime.sidecars}
    assert sorted(sidecars) == ["ctx", "gen"]
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as client:
        whole = _answer(client, "tiny-whole", stream)
        before = {name: _handoffs(sidecar) for name, sidecar in sidecars.items()}
        split = _answer(client, "tiny-split", stream)
    assert split == whole and split
    # The context sidecar sent the prompt's KV cache and the generation sidecar took it.
    deadline = time.monotonic() + 20
    while any(_handoffs(sidecars[name]) <= before[name] for name in sidecars):
        assert time.monotonic() < deadline, "no handoff between the two sidecars"
        time.sleep(0.05)


def test_the_pools_of_the_split_model_are_its_sidecars(gateway: LiveGateway) -> None:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert value(text, "gateway_replica_up", model="tiny-split/context", replica="ctx") == 1
    assert value(text, "gateway_replica_up", model="tiny-split", replica="gen") == 1
    # The model without routing.disaggregation runs whole on the generation sidecar alone.
    assert value(text, "gateway_replica_up", model="tiny-whole", replica="gen") == 1
    assert 'gateway_replica_up{model="tiny-whole",replica="ctx"}' not in text
