"""Which instance of the engine model publishes its metrics: the first of the first group, on
that group's first GPU, as Triton names the instances of a normalized config."""

from __future__ import annotations

from typing import Any

import pytest

from deploy.triton.engine.config import is_first_instance


def _config(*groups: dict[str, Any]) -> dict[str, Any]:
    return {"name": "m_tensorrt_llm", "instance_group": list(groups)}


CPU = {"name": "m_tensorrt_llm_0", "kind": "KIND_CPU", "count": 2}
NAMED = {"name": "engine", "kind": "KIND_CPU", "count": 2}
GPUS = {"name": "m_tensorrt_llm_0", "kind": "KIND_GPU", "count": 1, "gpus": [2, 3]}


@pytest.mark.parametrize(
    ("config", "instance", "device", "first"),
    [
        (_config(CPU), "m_tensorrt_llm_0_0", "0", True),
        (_config(CPU), "m_tensorrt_llm_0_1", "0", False),
        (_config(CPU, {**CPU, "name": "m_tensorrt_llm_1"}), "m_tensorrt_llm_1_0", "0", False),
        (_config(NAMED), "engine_0", "0", True),
        (_config(NAMED), "engine_1", "0", False),
        # Each GPU of a group gets instances of the same names: the group's first GPU reports.
        (_config(GPUS), "m_tensorrt_llm_0_0", "2", True),
        (_config(GPUS), "m_tensorrt_llm_0_0", "3", False),
        # A group Triton left unnamed is named after the model and its index.
        (_config({"kind": "KIND_CPU", "count": 2}), "m_tensorrt_llm_0_0", "0", True),
        (_config({"kind": "KIND_CPU", "count": 2}), "m_tensorrt_llm_0_1", "0", False),
        ({"name": "m"}, "m_0_0", "0", True),
    ],
)
def test_only_the_first_instance_is_first(
    config: dict[str, Any], instance: str, device: str, first: bool
) -> None:
    assert is_first_instance(config, instance, device) is first
