"""A model served by several real tritonservers on loopback, through the gateway: balance, a
slow replica, prefix and adapter affinity, saturation, DNS changes, and a replica killed under
load.

Four supervised tritonservers with the tiny model, on 127.0.0.1 to 127.0.0.4 and the same ports
(as the pods behind a headless Service): r1 to r3 alike, r4 made slow by an engine batch size of
one, so its requests queue.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deploy.sidecar.supervisor import Sidecar
from gateway.replicas.settings import EndpointSettings, RoutingSettings
from gateway.settings import AdapterSettings, LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.support.gateway import LiveGateway
from tests.support.lora import AdapterRecipe, make_peft_adapter
from tests.support.replicas import served, start_replicas, stop_replicas

pytestmark = pytest.mark.slow

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
IN_FLIGHT = re.compile(r'^gateway_replica_in_flight\{model="(\w[\w-]*)",replica="([^"]+)"\} (\S+)$')
UP = re.compile(r'^gateway_replica_up\{model="(\w[\w-]*)",replica="([^"]+)"\} (\S+)$')


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


@pytest.fixture(scope="module")
def replicas(
    tiny_model_dir: Path,
    adapters: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Replicas]:
    workdir = tmp_path_factory.mktemp("replicas")
    third = make_peft_adapter(
        tiny_model_dir,
        workdir / "lora-c",
        AdapterRecipe(rank=2, alpha=4, targets=("q_proj", "v_proj"), seed=3),
    )
    sidecars = start_replicas(tiny_model_dir, workdir, HOSTS, (16, 16, 16, 1))
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
            model("tiny-mixed", endpoints([r1, r2, r4])),
            model("tiny-limited", endpoints([r1, r2]), max_in_flight=2),
            model("tiny-dns", f"dns:{DNS_NAME}:{r1.grpc_port}", metrics_port=r1.metrics_port),
        ),
        limits=LimitSettings(request_timeout_s=60.0, shutdown_grace_s=5.0, retry_after_s=2),
        tenancy=TenancySettings(auth=False),
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
        deadline = time.monotonic() + 60
        while httpx.get(f"{gateway.url}/health/ready", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "the gateway never became ready"
            time.sleep(0.1)
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


async def sample_in_flight(
    client: httpx.AsyncClient, model: str, stop: asyncio.Event
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = defaultdict(list)
    while not stop.is_set():
        text = (await client.get("/metrics")).text
        for line in text.splitlines():
            match = IN_FLIGHT.match(line)
            if match and match[1] == model:
                samples[match[2]].append(float(match[3]))
        await asyncio.sleep(0.05)
    return samples


async def test_uniform_load_is_spread_evenly(replicas: Replicas) -> None:
    before = replicas.served()
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=replicas.url, timeout=60) as client:
        sampler = asyncio.create_task(sample_in_flight(client, "tiny", stop))
        answers = await closed_loop(
            client,
            lambda w, i: (body("tiny", f"{WORDS[w]} {WORDS[i % 18]}", 32), {}),
            clients=12,
            seconds=4,
        )
        stop.set()
        samples = await sampler
    assert {a.status_code for a in answers} == {200}
    means = {name: sum(values) / len(values) for name, values in samples.items()}
    assert set(means) == {"r1", "r2", "r3"}
    assert max(means.values()) / min(means.values()) <= 1.5, means
    after = replicas.served()
    # Every replica of the model took its share (how fast each ran is the machine's doing).
    assert all(after[name] > before[name] + 20 for name in ("r1", "r2", "r3"))
    assert after["r4"] == before["r4"]


async def test_a_slow_replica_gets_less_traffic(replicas: Replicas) -> None:
    before = replicas.served()
    async with httpx.AsyncClient(base_url=replicas.url, timeout=60) as client:
        answers = await closed_loop(
            client,
            lambda w, i: (body("tiny-mixed", f"{WORDS[w]} {WORDS[i % 18]}", 32), {}),
            clients=12,
            seconds=4,
        )
    assert {a.status_code for a in answers} == {200}
    after = replicas.served()
    counts = {name: after[name] - before[name] for name in ("r1", "r2", "r4")}
    # Round robin would give r4 a third; its queue keeps it below either other replica.
    assert 0 < counts["r4"] < min(counts["r1"], counts["r2"]), counts
    assert counts["r4"] < 0.25 * sum(counts.values()), counts


def _prefix(group: int) -> str:
    words = [WORDS[(group * 7 + i * (group + 1)) % len(WORDS)] for i in range(320)]
    return f"group {group}: " + " ".join(words)


async def test_prefix_affinity_keeps_a_prefix_on_one_replica(replicas: Replicas) -> None:
    before = replicas.served()
    groups = 6

    def make(worker: int, i: int) -> tuple[dict[str, object], dict[str, str]]:
        group = (worker + i) % groups
        prompt = f"{_prefix(group)} question {worker}-{i}"
        return body("tiny", prompt, 2), {"X-Request-ID": f"prefix-{group}-{worker}-{i}"}

    async with httpx.AsyncClient(base_url=replicas.url, timeout=60) as client:
        answers = await closed_loop(client, make, clients=6, each=12)
    assert {a.status_code for a in answers} == {200}
    assert answers[0].json()["usage"]["prompt_tokens"] >= 4 * 64
    pool = replicas.router().pool("tiny")
    assert pool.block_tokens == 64  # read from the engines' tokens_per, not the 16 configured

    where = replicas.replica_of_requests()
    by_group: dict[int, Counter[str]] = defaultdict(Counter)
    for request_id, replica in where.items():
        if request_id.startswith("prefix-"):
            by_group[int(request_id.split("-")[1])][replica] += 1
    assert sum(sum(c.values()) for c in by_group.values()) == 6 * 12
    for group, seen in by_group.items():
        assert seen.most_common(1)[0][1] / sum(seen.values()) >= 0.9, (group, seen)
    after = replicas.served()
    counts = {name: after[name] - before[name] for name in ("r1", "r2", "r3")}
    assert max(counts.values()) / min(counts.values()) <= 1.5, counts


async def test_adapter_affinity_keeps_an_adapter_on_one_replica(replicas: Replicas) -> None:
    before = replicas.served()
    names = ["lora-a", "lora-b", "lora-c"]

    def make(worker: int, i: int) -> tuple[dict[str, object], dict[str, str]]:
        name = names[(worker + i) % 3]
        return body(name, f"{WORDS[i % 18]} {worker}", 4), {
            "X-Request-ID": f"lora-{name}-{worker}-{i}"
        }

    async with httpx.AsyncClient(base_url=replicas.url, timeout=60) as client:
        answers = await closed_loop(client, make, clients=6, each=10)
    assert {a.status_code for a in answers} == {200}
    where = replicas.replica_of_requests()
    by_adapter: dict[str, Counter[str]] = defaultdict(Counter)
    for request_id, replica in where.items():
        if request_id.startswith("lora-"):
            by_adapter[request_id.split("-")[2]][replica] += 1
    assert set(by_adapter) == {"a", "b", "c"}
    for adapter, seen in by_adapter.items():
        assert seen.most_common(1)[0][1] / sum(seen.values()) >= 0.9, (adapter, seen)
    after = replicas.served()
    counts = {name: after[name] - before[name] for name in ("r1", "r2", "r3")}
    assert max(counts.values()) / min(counts.values()) <= 1.5, counts
    text = httpx.get(f"{replicas.url}/metrics").text
    hits = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('gateway_replica_adapter_hits_total{model="tiny"')
    )
    assert hits >= 0.9 * 60 - 3


async def test_every_replica_saturated_is_a_503_and_nothing_hangs(replicas: Replicas) -> None:
    async with httpx.AsyncClient(base_url=replicas.url, timeout=60) as client:
        start = time.monotonic()
        answers = await asyncio.gather(
            *(
                client.post("/v1/completions", json=body("tiny-limited", "river", 400))
                for _ in range(8)
            )
        )
        elapsed = time.monotonic() - start
        statuses = Counter(a.status_code for a in answers)
        assert statuses == {200: 4, 503: 4}, statuses
        refused = [a for a in answers if a.status_code == 503]
        assert all(a.headers["retry-after"] == "2" for a in refused)
        assert all(a.json()["error"]["code"] == "overloaded" for a in refused)
        assert elapsed < 45
        # The queue emptied: a new request is taken.
        again = await client.post("/v1/completions", json=body("tiny-limited", "river", 4))
        assert again.status_code == 200
        text = (await client.get("/metrics")).text
    assert 'gateway_model_overloaded_total{model="tiny-limited"} 4.0' in text


async def test_dns_changes_add_and_remove_replicas(replicas: Replicas) -> None:
    pool = replicas.router().pool("tiny-dns")
    port = replicas.sidecars[0].grpc_port

    async def send(count: int) -> dict[str, int]:
        before = replicas.served()
        async with httpx.AsyncClient(base_url=replicas.url, timeout=60) as client:
            answers = await closed_loop(
                client, lambda w, i: (body("tiny-dns", "cloud", 2), {}), clients=3, each=count
            )
        assert {a.status_code for a in answers} == {200}
        after = replicas.served()
        return {name: after[name] - before[name] for name in after if after[name] != before[name]}

    assert sorted(pool.replicas) == [f"127.0.0.1:{port}", f"127.0.0.2:{port}"]
    assert set(await send(4)) == {"r1", "r2"}
    replicas.addresses = ["127.0.0.2", "127.0.0.3"]
    deadline = time.monotonic() + 5
    while sorted(r for r, s in pool.replicas.items() if s.health.routable) != [
        f"127.0.0.2:{port}",
        f"127.0.0.3:{port}",
    ]:
        assert time.monotonic() < deadline, sorted(pool.replicas)
        await asyncio.sleep(0.05)
    assert set(await send(4)) == {"r2", "r3"}


async def _stream(client: httpx.AsyncClient, model: str, tokens: int) -> tuple[int, str]:
    async with client.stream(
        "POST", "/v1/completions", json=body(model, "harbor meadow", tokens, stream=True)
    ) as response:
        text = "".join([chunk async for chunk in response.aiter_text()])
    return response.status_code, text


def _up(text: str, model: str, replica: str) -> float | None:
    for line in text.splitlines():
        match = UP.match(line)
        if match and (match[1], match[2]) == (model, replica):
            return float(match[3])
    return None


async def test_a_replica_killed_under_load(replicas: Replicas) -> None:
    r4 = replicas.by_name()["r4"]
    async with httpx.AsyncClient(base_url=replicas.url, timeout=90) as client:
        ready_codes: list[int] = []
        stop = asyncio.Event()

        async def watch_readiness() -> None:
            while not stop.is_set():
                ready_codes.append((await client.get("/health/ready")).status_code)
                await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch_readiness())
        # Long streams on every replica of tiny-mixed (r4 runs one and queues the rest).
        streams = [asyncio.create_task(_stream(client, "tiny-mixed", 600)) for _ in range(9)]
        pool = replicas.router().pool("tiny-mixed")
        deadline = time.monotonic() + 20
        while pool.replicas["r4"].in_flight < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        # Short whole answers keep coming while r4 dies: none may fail.
        background = asyncio.create_task(
            closed_loop(
                client,
                lambda w, i: (body("tiny-mixed", f"{WORDS[w]}", 8), {}),
                clients=4,
                seconds=3,
            )
        )
        await asyncio.sleep(0.5)
        assert r4.pid is not None
        killed_at = time.monotonic()
        os.killpg(r4.pid, signal.SIGKILL)
        while _up((await client.get("/metrics")).text, "tiny-mixed", "r4") != 0.0:
            assert time.monotonic() - killed_at < 2.0, "r4 not ejected within 2 s"
            await asyncio.sleep(0.02)
        answers = await background
        results = await asyncio.gather(*streams)

        assert answers and {a.status_code for a in answers} == {200}
        broken = 0
        for status, text in results:
            assert status == 200
            assert text.rstrip().endswith("data: [DONE]")
            if '"error"' in text:
                broken += 1
                # In-band, after output had started.
                assert text.index('"text"') < text.index('"error"')
        assert broken >= 1  # the stream r4 was running
        # Those queued on r4 without a token yet went to another replica instead.
        metrics = (await client.get("/metrics")).text
        assert 'gateway_replica_retries_total{model="tiny-mixed",replica="r4"}' in metrics
        assert 'gateway_replica_retries_total{model="tiny-mixed",replica="r4"} 0.0' not in metrics

        # Taken back once its supervisor has restarted it.
        deadline = time.monotonic() + 60
        while _up((await client.get("/metrics")).text, "tiny-mixed", "r4") != 1.0:
            assert time.monotonic() < deadline, "r4 never taken back"
            await asyncio.sleep(0.2)
        stop.set()
        await watcher
        served_before = served(r4)
        await closed_loop(
            client, lambda w, i: (body("tiny-mixed", "stone", 2), {}), clients=3, each=4
        )
        assert served(r4) > served_before
    assert ready_codes and set(ready_codes) == {200}
