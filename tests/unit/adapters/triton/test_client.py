"""The Triton backend's per-request choices that need no server: what reaches Triton of a
request's priority."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.triton.client import request_priority
from adapters.triton.config import parse_model_config
from tests.support.stock_configs import stock


@pytest.mark.parametrize(
    ("batching", "sent"),
    [(None, {1: 0, 5: 0}), ({}, {1: 0, 5: 0}), ({"priority_levels": 3}, {0: 0, 1: 1, 5: 3})],
    ids=["no-batcher", "no-levels", "three-levels"],
)
def test_a_priority_reaches_triton_only_where_the_model_declares_levels(
    batching: dict[str, Any] | None, sent: dict[int, int]
) -> None:
    """TensorRT-LLM's executor schedules on its own: Triton's request priority means
    something only to a model whose dynamic batcher has ``priority_levels``."""
    document = dict(stock("tensorrt_llm")["config"])
    document.pop("dynamic_batching", None)
    if batching is not None:
        document["dynamic_batching"] = batching
    model = parse_model_config(document)
    assert {given: request_priority(model, given) for given in sent} == sent
