"""Offline bundles: what is packed, and the numpy < 2 text environment inside a real sidecar."""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.devtools.offline import _names, _server_members, _text_view, runtime_closure
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar, sidecar_from_spec
from tests.support.engine_probe import EngineProcess
from tests.support.sidecars import QUICK_STOP
from tests.support.text_env import VERSION


def test_runtime_closure_holds_the_gateway_and_not_the_engine() -> None:
    closure = runtime_closure(VERSION)
    for name in ("litestar", "msgspec", "tritonclient", "grpcio", "redis", "transformers"):
        assert name in closure, name
    for name in ("torch", "pytest", "openai", "xgrammar", "nvidia-pytriton"):
        assert name not in closure, name


def test_exclusions_read_commas_and_freeze_files(tmp_path: Path) -> None:
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("numpy==2.5.2\nTorch==2.11.0\nhuggingface_hub>=1\n")
    assert _names([str(freeze), "PyYAML,grpcio"]) == {
        "numpy",
        "torch",
        "huggingface-hub",
        "pyyaml",
        "grpcio",
    }


def test_server_archive_has_the_binary_backend_and_stub_but_no_libpython() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    names = [name for _, name in _server_members(site, VERSION)]
    assert "pytriton/tritonserver/bin/tritonserver" in names
    assert (
        f"pytriton/tritonserver/python_backend_stubs/{VERSION}/triton_python_backend_stub" in names
    )
    assert "pytriton/tritonserver/backends/python/libtriton_python.so" in names
    assert any(name.startswith("nvidia_pytriton.libs/libtritonserver") for name in names)
    assert not [name for name in names if "libpython" in name]


def test_text_view_links_the_runtime_packages_without_numpy_or_torch(tmp_path: Path) -> None:
    view = _text_view(tmp_path / "view", runtime_closure(VERSION))
    entries = {path.name for path in view.iterdir()}
    assert {"transformers", "tokenizers", "jinja2", "deploy", "gateway"} <= entries
    assert not {"numpy", "torch"} & entries
    assert all(path.resolve().exists() for path in view.iterdir())


@pytest.fixture(scope="module")
def text_env_sidecar(
    text_env: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sidecar]:
    spec = parse_spec(
        {
            "models": [
                {
                    "name": "txt",
                    "engine": {"kind": "torch", "model_dir": str(tiny_model_dir)},
                    "text_python_env": str(text_env),
                }
            ],
            "sidecars": [{"name": "textenv", **QUICK_STOP}],
        }
    )
    sidecar = sidecar_from_spec(spec, spec.sidecars[0], tmp_path_factory.mktemp("textenv"))
    sidecar.start()
    yield sidecar
    sidecar.stop()


@pytest.mark.slow
def test_text_models_run_in_their_environment_and_generate(
    text_env_sidecar: Sidecar, text_env: Path
) -> None:
    body = {"text_input": "def add(a, b):", "max_tokens": 8, "stream": True}
    url = f"{text_env_sidecar.http_url}/v2/models/txt_ensemble/generate_stream"
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        events = [
            json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")
        ]
    assert response.status_code == 200
    assert not [event for event in events if "error" in event]
    assert "".join(event["text_output"] for event in events)

    stubs = EngineProcess.every(text_env_sidecar)
    assert set(stubs) == {
        f"txt_{name}"
        for name in ("preprocessing", "postprocessing", "tensorrt_llm_bls", "tensorrt_llm")
    }
    for name, stub in stubs.items():
        if name == "txt_tensorrt_llm":
            assert stub.environment() != text_env
            assert stub.maps_torch()
        else:
            assert stub.environment() == text_env, name
            assert not stub.maps_torch(), name
