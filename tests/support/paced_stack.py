"""A tritonserver with the paced load-test engine and a gateway with tenants in front of it,
its model capped at a few requests in flight: the fair queue's tests and benchmark."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from gateway.queueing.gate import ModelSlots
from gateway.queueing.settings import QueueSettings
from gateway.replicas.settings import EndpointSettings, RoutingSettings
from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import KeyEntry, StoreSettings, TenancySettings, TenantPolicy
from gateway.tenancy.service import digest, new_key
from tests.support.gateway import LiveGateway
from tests.support.sidecars import QUICK_STOP

MODEL = "paced"
ENGINE_MODEL = "paced_tensorrt_llm"
REPLICA_ENGINE_MODEL = "tiny_tensorrt_llm"


@contextmanager
def paced_sidecar(
    tokenizer_dir: Path, workdir: Path, *, token_s: float, batch: int
) -> Iterator[Sidecar]:
    """A tritonserver with only the paced engine model: ``batch`` streams at once, one token
    every ``token_s`` each."""
    engine = {
        "kind": "loadtest",
        "tokenizer_dir": str(tokenizer_dir),
        "token_s": token_s,
        "max_batch_size": batch,
    }
    spec = parse_spec(
        {
            "models": [{"name": MODEL, "release": "latest", "engine": engine}],
            "sidecars": [
                {
                    "name": "paced",
                    "extra_args": ["--model-control-mode=explicit", f"--load-model={ENGINE_MODEL}"],
                    **QUICK_STOP,
                }
            ],
        }
    )
    sidecar = sidecar_from_spec(spec, spec.sidecars[0], workdir)
    sidecar.start()
    try:
        yield sidecar
    finally:
        sidecar.stop()


class Callers(Protocol):
    """Who holds the tenants' keys: the headers each tenant's requests carry."""

    def headers(self, tenant: str) -> dict[str, str]: ...


@dataclass
class Stack:
    """The running gateway and its tenants' keys."""

    gateway: LiveGateway
    keys: dict[str, str]
    admin_key: str

    @property
    def url(self) -> str:
        return self.gateway.url

    def slots(self) -> ModelSlots:
        slots = self.gateway.app.state.runtime.router.slots(MODEL)
        assert slots is not None
        return slots  # type: ignore[no-any-return]

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"}

    def headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}


@contextmanager
def paced_gateway(
    sidecar: Sidecar | Sequence[Sidecar],
    tokenizer_dir: Path,
    tenants: Mapping[str, TenantPolicy],
    *,
    max_in_flight: int | None,
    queueing: QueueSettings | None = None,
    store: StoreSettings | None = None,
    keys: Mapping[str, str] | None = None,
    admin_key: str | None = None,
) -> Iterator[Stack]:
    """A gateway serving the paced engine as ``paced`` to ``tenants``, ``max_in_flight`` at
    once: on the one ``sidecar``, or on each of several (``start_replicas``'s, whose engine
    model is ``tiny_tensorrt_llm``) as its replicas."""
    keys = dict(keys or {name: new_key() for name in tenants})
    admin_key = admin_key or new_key()
    if isinstance(sidecar, Sidecar):
        where: dict[str, Any] = {"triton_url": sidecar.grpc_url, "triton_model": ENGINE_MODEL}
        routing = RoutingSettings(max_in_flight=max_in_flight)
    else:
        replicas = tuple(
            EndpointSettings(url=s.grpc_url, metrics_url=s.metrics_url, name=s.name)
            for s in sidecar
        )
        where = {"replicas": replicas, "triton_model": REPLICA_ENGINE_MODEL}
        routing = RoutingSettings(
            max_in_flight=max_in_flight, probe_interval_s=0.25, scrape_interval_s=0.25
        )
    settings = Settings(
        models=(
            ModelSettings(
                name=MODEL,
                entry="tensorrt_llm",
                tokenizer_dir=str(tokenizer_dir),
                routing=routing,
                **where,
            ),
        ),
        limits=LimitSettings(request_timeout_s=120.0, shutdown_grace_s=2.0, retry_after_s=2),
        tenancy=TenancySettings(
            tenants=tuple(tenants.values()),
            keys=tuple(KeyEntry(tenant=name, sha256=digest(key)) for name, key in keys.items()),
            admin_key_sha256=digest(admin_key),
            store=store or StoreSettings(),
        ),
        queueing=queueing or QueueSettings(),
    )
    gateway = LiveGateway(settings).start()
    try:
        gateway.wait_ready()
        yield Stack(gateway, keys, admin_key)
    finally:
        gateway.stop()


def completion(tokens: int, **extra: Any) -> dict[str, Any]:
    """A streamed completion of exactly ``tokens`` tokens."""
    return {
        "model": MODEL,
        "prompt": "river stone cloud",
        "max_tokens": tokens,
        "min_tokens": tokens,
        "stream": True,
        **extra,
    }


@dataclass
class Answer:
    """One streamed request as its client saw it."""

    tenant: str
    status: int
    started: float
    first_token: float | None = None
    ended: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)
    body: str = ""

    @property
    def ttft(self) -> float:
        assert self.first_token is not None, self
        return self.first_token - self.started


async def stream_one(
    client: httpx.AsyncClient, stack: Callers, tenant: str, body: dict[str, Any]
) -> Answer:
    """Send one streamed completion as ``tenant`` and read it to its end."""
    started = time.monotonic()
    async with client.stream(
        "POST", "/v1/completions", json=body, headers=stack.headers(tenant)
    ) as response:
        answer = Answer(tenant, response.status_code, started, headers=dict(response.headers))
        if response.status_code != 200:
            answer.body = (await response.aread()).decode()
        else:
            async for line in response.aiter_lines():
                if line.startswith("data: {") and answer.first_token is None:
                    answer.first_token = time.monotonic()
    answer.ended = time.monotonic()
    return answer


async def flood(
    client: httpx.AsyncClient,
    stack: Callers,
    tenant: str,
    body: dict[str, Any],
    *,
    streams: int,
    until: asyncio.Event,
    answers: list[Answer],
) -> None:
    """``streams`` closed loops of ``tenant`` sending ``body`` until ``until`` is set."""

    async def loop() -> None:
        while not until.is_set():
            answers.append(await stream_one(client, stack, tenant, body))

    await asyncio.gather(*(loop() for _ in range(streams)))
