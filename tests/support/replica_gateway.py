"""Four tritonservers on loopback and a gateway routing over them, for the replica tests.

Four supervised tritonservers on 127.0.0.1 to 127.0.0.4 and the same ports (as the pods behind a
headless Service): r1 to r3 alike, with the tiny model; r4 slow, the paced load-test engine with
the tiny tokenizer, one stream at a time at 100 tokens/s, so its requests queue and a long stream
there is still being produced whatever the gateway has read of it (the tiny model at a batch of
one would produce it faster than a loaded gateway reads).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deploy.sidecar.supervisor import Sidecar
from gateway.queueing.settings import QueueSettings
from gateway.replicas.settings import EndpointSettings, RoutingSettings, ScoreWeights
from gateway.settings import AdapterSettings, LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.support.gateway import LiveGateway
from tests.support.lora import AdapterRecipe, make_peft_adapter
from tests.support.replicas import served, start_replicas, stop_replicas

HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")
DNS_NAME = "replicas.test"
FAST = RoutingSettings(probe_interval_s=0.25, scrape_interval_s=0.25, resolve_interval_s=0.2)
WORDS = [
    "river",
    "stone",
    "cloud",
    "garden",
    "window",
    "lantern",
    "harbor",
    "meadow",
    "silver",
    "candle",
    "thunder",
    "valley",
    "orchard",
    "feather",
    "compass",
    "marble",
    "bridge",
    "forest",
]


class Replicas:
    """The running servers, the gateway in front of them, and what it recorded."""

    def __init__(self, sidecars: list[Sidecar], gateway: LiveGateway, spans: InMemorySpanExporter):
        self.sidecars = sidecars
        self.gateway = gateway
        self.spans = spans
        self.addresses = ["127.0.0.1", "127.0.0.2"]
        """What the DNS name resolves to now."""

    @property
    def url(self) -> str:
        return self.gateway.url

    def by_name(self) -> dict[str, Sidecar]:
        return {sidecar.name: sidecar for sidecar in self.sidecars}

    def served(self) -> dict[str, int]:
        return {sidecar.name: served(sidecar) for sidecar in self.sidecars}

    def router(self) -> Any:
        return self.gateway.app.state.runtime.router

    def replica_of_requests(self) -> dict[str, str]:
        """Each request id's replica, from the ``triton.generate`` spans."""
        spans = self.spans.get_finished_spans()
        request_ids = {
            span.context.span_id: span.attributes["gateway.request_id"]
            for span in spans
            if span.attributes and "gateway.request_id" in span.attributes
        }
        found = {}
        for span in spans:
            if span.name == "triton.generate" and span.parent is not None and span.attributes:
                request_id = request_ids.get(span.parent.span_id)
                if request_id is not None and "triton.replica" in span.attributes:
                    found[str(request_id)] = str(span.attributes["triton.replica"])
        return found


def endpoints(sidecars: Sequence[Sidecar]) -> tuple[EndpointSettings, ...]:
    return tuple(
        EndpointSettings(url=s.grpc_url, metrics_url=s.metrics_url, name=s.name) for s in sidecars
    )


@contextmanager
def replica_gateway(
    tiny_model_dir: Path, adapters: dict[str, Path], workdir: Path
) -> Iterator[Replicas]:
    """The four servers and a gateway over them serving ``tiny`` (r1-r3, the LoRA adapters),
    ``tiny-ties`` (r1-r3, the KV cache's use left out of the score), ``tiny-mixed`` (r1, r2 and
    the slow r4), ``tiny-limited`` (r1, r2, two requests each at
    most) and ``tiny-dns`` (what ``DNS_NAME`` resolves to, ``Replicas.addresses``)."""
    third = make_peft_adapter(
        tiny_model_dir,
        workdir / "lora-c",
        AdapterRecipe(rank=2, alpha=4, targets=("q_proj", "v_proj"), seed=3),
    )
    slow = {"kind": "loadtest", "tokenizer_dir": str(tiny_model_dir), "token_s": 0.01}
    sidecars = start_replicas(tiny_model_dir, workdir, HOSTS, (16, 16, 16, 1), engines={3: slow})
    r1, r2, r3, r4 = sidecars

    def model(name: str, replicas: object, **routing: object) -> ModelSettings:
        return ModelSettings(
            name=name,
            triton_model="tiny_tensorrt_llm",
            entry="tensorrt_llm",
            tokenizer_dir=str(tiny_model_dir),
            replicas=replicas,  # type: ignore[arg-type]
            routing=msgspec.structs.replace(FAST, **routing),
        )

    settings = Settings(
        models=(
            msgspec.structs.replace(
                model("tiny", endpoints([r1, r2, r3]), prefix_block_tokens=16),
                adapters=(
                    AdapterSettings(name="lora-a", path=str(adapters["lora-a"])),
                    AdapterSettings(name="lora-b", path=str(adapters["lora-b"])),
                    AdapterSettings(name="lora-c", path=str(third)),
                ),
            ),
            # Ties on load and affinity alone: the engines' KV-cache use, scraped, lags the
            # requests one at a time and breaks no tie here.
            model("tiny-ties", endpoints([r1, r2, r3]), weights=ScoreWeights(kv_cache=0.0)),
            model("tiny-mixed", endpoints([r1, r2, r4])),
            model("tiny-limited", endpoints([r1, r2]), max_in_flight=2),
            model("tiny-dns", f"dns:{DNS_NAME}:{r1.grpc_port}", metrics_port=r1.metrics_port),
        ),
        limits=LimitSettings(request_timeout_s=60.0, shutdown_grace_s=5.0, retry_after_s=2),
        tenancy=TenancySettings(auth=False),
        # tiny-limited shows a saturated pool's 503; requests waiting instead have their tests
        # in test_fair_queueing.
        queueing=QueueSettings(enabled=False),
    )
    state: dict[str, Replicas] = {}

    async def resolver(host: str, port: int) -> list[str]:
        assert (host, port) == (DNS_NAME, r1.grpc_port)
        return list(state["replicas"].addresses)

    spans = InMemorySpanExporter()
    gateway = LiveGateway(settings, span_exporter=spans, resolver=resolver)
    state["replicas"] = Replicas(sidecars, gateway, spans)
    gateway.start()
    try:
        gateway.wait_ready()
        yield state["replicas"]
    finally:
        gateway.stop()
        stop_replicas(sidecars)


def body(model: str, prompt: str, tokens: int, **extra: object) -> dict[str, object]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0,
        **extra,
    }


async def closed_loop(
    client: httpx.AsyncClient,
    make: Any,
    *,
    clients: int,
    seconds: float | None = None,
    each: int | None = None,
) -> list[httpx.Response]:
    """``clients`` workers sending ``make(worker, i)`` bodies one after another."""
    deadline = time.monotonic() + (seconds or 1e9)
    answers: list[httpx.Response] = []

    async def worker(index: int) -> None:
        i = 0
        while time.monotonic() < deadline and (each is None or i < each):
            request_body, headers = make(index, i)
            answers.append(await client.post("/v1/completions", json=request_body, headers=headers))
            i += 1

    await asyncio.gather(*(worker(index) for index in range(clients)))
    return answers
