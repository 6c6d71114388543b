"""The tiny model as the gateway serves it, for the generation core's tests."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.catalog.registry import ServedModel, load_model
from tests.support.tiny_routes import tiny_route


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> ServedModel:
    return load_model(tiny_route(tiny_model_dir), ThreadPoolExecutor(1))
