"""The getting-started guide's path from the demo to a configuration of one's own, run as written.

``triton-gateway init DIR`` then ``triton-gateway serve --config DIR/gateway.yaml``: SmolLM2 in a
sidecar on the CPU (the engine's device left unset), two tenants with their keys and limits, an
admin key and a LoRA adapter, used through the openai SDK with the keys ``init`` printed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.support.gateway import free_port, stop_process

pytestmark = [pytest.mark.slow, pytest.mark.smollm]

COMMAND = str(Path(sys.executable).parent / "triton-gateway")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@dataclass
class Served:
    """The gateway `serve` runs from the folder `init` wrote, and the keys `init` printed."""

    url: str
    keys: dict[str, str]
    folder: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """`serve` the starter's own files, and wait until it is ready."""
        log = self.folder.parent / "serve.log"
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [COMMAND, "serve", "--config", str(self.folder / "gateway.yaml"),
                 "--port", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 240
        while not _ready(self.url):
            assert self.process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None


def _keys(printed: str) -> dict[str, str]:
    return dict(re.findall(r"^  (admin|team-a|team-b):\s+(tgw-\S+)", printed, flags=re.M))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("starter") / "my-gateway"
    init = subprocess.run(
        [COMMAND, "init", str(folder)], capture_output=True, text=True, timeout=300
    )
    assert init.returncode == 0, init.stderr
    keys = _keys(init.stdout)
    assert set(keys) == {"admin", "team-a", "team-b"}
    assert f"triton-gateway serve --config {folder / 'gateway.yaml'}" in init.stdout
    port = free_port()
    served = Served(f"http://127.0.0.1:{port}", keys, folder, port)
    try:
        served.start()
        yield served
    finally:
        served.stop()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_init_writes_a_cpu_config_with_tenants_and_an_adapter(served: Served) -> None:
    config = yaml.safe_load((served.folder / "gateway.yaml").read_text())
    assert [t["name"] for t in config["tenancy"]["tenants"]] == ["team-a", "team-b"]
    assert "tgw-" not in str(config), "keys are stored as digests only"
    spec = yaml.safe_load((served.folder / "deploy.yaml").read_text())
    assert "device" not in spec["models"][0]["engine"]
    again = subprocess.run(
        [COMMAND, "init", str(served.folder)], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 2 and "not overwritten" in again.stderr


def test_a_tenant_chats_with_the_model_and_its_adapter(served: Served) -> None:
    team_a = _client(served.url, served.keys["team-a"])
    # Greedy: a sampled answer of a 135M model names Paris only most of the time.
    reply = team_a.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0)
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.usage is not None and reply.usage.completion_tokens <= 256
    adapted = team_a.chat.completions.create(
        model="smollm2-example", messages=QUESTION, max_tokens=16
    )
    assert adapted.model == "smollm2-example" and adapted.choices[0].message.content


def test_the_other_tenant_sees_only_the_base_model(served: Served) -> None:
    team_b = _client(served.url, served.keys["team-b"])
    assert [model.id for model in team_b.models.list()] == ["smollm2"]
    with pytest.raises(openai.NotFoundError):
        team_b.chat.completions.create(model="smollm2-example", messages=QUESTION, max_tokens=8)


def test_keys_open_only_what_they_are_for(served: Served) -> None:
    admin = {"Authorization": f"Bearer {served.keys['admin']}"}
    assert httpx.get(f"{served.url}/admin/tenants", headers=admin, timeout=10).status_code == 200
    as_tenant = {"Authorization": f"Bearer {served.keys['team-a']}"}
    refused = httpx.get(f"{served.url}/admin/tenants", headers=as_tenant, timeout=10)
    assert refused.status_code in (401, 403)
    with pytest.raises(openai.AuthenticationError):
        _client(served.url, "tgw-not-a-key").models.list()


def test_nothing_of_the_operator_or_of_other_tenants_is_shown_without_the_admin_key(
    served: Served,
) -> None:
    admin = {"Authorization": f"Bearer {served.keys['admin']}"}
    for headers in ({}, {"Authorization": f"Bearer {served.keys['team-a']}"}):
        for path in ("/metrics", "/metrics/sidecars/main"):
            refused = httpx.get(f"{served.url}{path}", headers=headers, timeout=10)
            assert refused.status_code == 401 and "team-b" not in refused.text
        ready = httpx.get(f"{served.url}/health/ready", headers=headers, timeout=10)
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}
        schema = httpx.get(f"{served.url}/openapi.json", headers=headers, timeout=10).json()
        assert not [path for path in schema["paths"] if path.startswith("/admin")]
    scraped = httpx.get(f"{served.url}/metrics", headers=admin, timeout=10)
    assert scraped.status_code == 200 and "gateway_requests_total" in scraped.text
    sidecar = httpx.get(f"{served.url}/metrics/sidecars/main", headers=admin, timeout=10)
    assert sidecar.status_code == 200
    assert httpx.get(f"{served.url}/health/ready", headers=admin, timeout=10).json()["models"]
    schema = httpx.get(f"{served.url}/openapi.json", headers=admin, timeout=10).json()
    assert "/admin/tenants" in schema["paths"]


def test_admin_changes_work_on_the_starter_and_survive_a_restart(served: Served) -> None:
    admin = {"Authorization": f"Bearer {served.keys['admin']}"}
    patched = httpx.patch(
        f"{served.url}/admin/tenants/team-b", json={"requests_per_minute": 7}, headers=admin
    )
    assert patched.status_code == 200, patched.text
    made = httpx.post(
        f"{served.url}/admin/keys", json={"tenant": "team-b", "name": "bot"}, headers=admin
    )
    assert made.status_code == 201, made.text
    key = made.json()["key"]
    assert [m.id for m in _client(served.url, key).models.list()] == ["smollm2"]

    served.stop()
    served.start()
    tenants = httpx.get(f"{served.url}/admin/tenants", headers=admin, timeout=10).json()["data"]
    team_b = next(tenant for tenant in tenants if tenant["name"] == "team-b")
    assert team_b["requests_per_minute"] == 7
    assert [m.id for m in _client(served.url, key).models.list()] == ["smollm2"]
    assert (served.folder / "tenancy.rdb").is_file()
