"""Offline bundles: what is packed, and the numpy < 2 text environment inside a real sidecar."""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.devtools.offline import (
    _names,
    _server_members,
    _text_view,
    link_distribution,
    runtime_closure,
)
from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
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
    # protobuf and googleapis-common-protos both fill the `google` namespace.
    assert (view / "google" / "protobuf" / "__init__.py").exists()
    assert (view / "google" / "api").is_dir()


class _Dist:
    """What ``link_distribution`` reads of an installed distribution."""

    def __init__(self, root: Path, files: list[str]) -> None:
        self.root, self.files = root, files
        for name in files:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text("")

    def locate_file(self, name: str) -> Path:
        return self.root / name


def test_a_namespace_shared_by_distributions_holds_what_each_brings(tmp_path: Path) -> None:
    view = tmp_path / "view"
    view.mkdir()
    first = _Dist(
        tmp_path / "a", ["google/api/__init__.py", "google/type/x.py", "alpha/__init__.py"]
    )
    second = _Dist(tmp_path / "b", ["google/protobuf/__init__.py", "google/api/other.py"])
    third = _Dist(tmp_path / "c", ["alpha/__init__.py", "alpha/extra.py"])
    for dist in (first, second, third):
        link_distribution(dist, view)
    assert (view / "google" / "protobuf" / "__init__.py").exists()
    assert (view / "google" / "type" / "x.py").exists()
    # A regular package is the first distribution's, as on sys.path.
    assert (view / "google" / "api").resolve() == tmp_path / "a" / "google" / "api"
    assert (view / "alpha").resolve() == tmp_path / "a" / "alpha"
    assert not (view / "alpha" / "extra.py").exists()


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
