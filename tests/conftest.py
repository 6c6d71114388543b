"""Session fixtures: the tiny test model and a real tritonserver sidecar hosting two pipelines."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.supervisor import Sidecar
from tests.support.redis_server import RedisServer
from tests.support.shared_sidecars import SharedSidecars, controller_configure, controller_report
from tests.support.sidecars import tiny_spec

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
SHARED = SharedSidecars()


def pytest_configure(config: pytest.Config) -> None:
    controller_configure(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    controller_report(config)


@pytest.fixture(autouse=True)
def _shared_sidecars_serve(request: pytest.FixtureRequest) -> None:
    """A shared sidecar that crashed serves again before the next test starts."""
    SHARED.before_test(request.node.nodeid, "sidecar" in request.fixturenames)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The deterministic tiny Llama with its byte-level BPE tokenizer and ChatML template."""
    from deploy.sidecar.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir: Path) -> Any:
    """The tiny model in transformers, the reference the engine's outputs are checked against."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="session")
def text_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A text environment (no torch) as the offline install makes one, for Python models."""
    from tests.support.text_env import make_text_env

    return make_text_env(tmp_path_factory.mktemp("offline"))


@pytest.fixture(scope="session")
def sidecar(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A running tritonserver hosting all five models of ``tiny`` and of ``tiny2``."""
    spec = tiny_spec(tiny_model_dir)
    server = sidecar_from_spec(spec, spec.sidecars[0], tmp_path_factory.mktemp("sidecar"))
    server.start()
    SHARED.add(server)
    yield server
    SHARED.remove(server)
    server.stop()


@pytest.fixture(scope="session")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The PEFT LoRA adapters of ``tests/lora_fixtures.RECIPES`` on the tiny model."""
    from tests.support.lora import RECIPES, make_peft_adapter

    root = tmp_path_factory.mktemp("peft")
    return {
        name: make_peft_adapter(tiny_model_dir, root / name, recipe)
        for name, recipe in RECIPES.items()
    }


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server for the module's tests (each module its own, so none sees another's
    keys or outage)."""
    server = RedisServer().start()
    yield server
    server.stop()
