"""The flow a request is queued in, carried from the HTTP path to the model's slots.

The flow rides the request's context (a ``ContextVar``, copied into every task the request
starts), so that the generation core, which knows nothing of tenants, carries it untouched to
the one place where a slot is taken.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Literal

from gateway.queueing.scheduler import Flow

ServiceTier = Literal["auto", "default", "flex", "priority"]
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
"""The flow llm-d's flow control queues a request in (its fairness between flows)."""
OBJECTIVE_HEADER = "x-llm-d-inference-objective"
"""The ``InferenceObjective`` (``llm-d.ai/v1alpha2``) whose priority band a request is in."""
current_flow: ContextVar[Flow | None] = ContextVar("queue_flow", default=None)
"""The flow of the request being served (None outside the HTTP path)."""


def llm_d_headers(flow: Flow, objectives: Mapping[int, str]) -> dict[str, str]:
    """The headers llm-d's endpoint picker reads for ``flow``: its tenant as the fairness id,
    and the objective of the highest class in ``objectives`` at or below the flow's (none
    where every one is above it)."""
    headers = {FAIRNESS_HEADER: flow.tenant}
    classes = [level for level in objectives if level <= flow.priority_class]
    if classes:
        headers[OBJECTIVE_HEADER] = objectives[max(classes)]
    return headers
