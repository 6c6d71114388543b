"""The flow a request is queued in, carried from the HTTP path to the model's slots.

The flow rides the request's context (a ``ContextVar``, copied into every task the request
starts), so that the generation core, which knows nothing of tenants, carries it untouched to
the one place where a slot is taken.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Literal

from gateway.errors import InvalidRequestError
from gateway.queueing.scheduler import Flow

ServiceTier = Literal["auto", "default", "flex", "priority"]
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
"""The flow llm-d's flow control queues a request in (its fairness between flows)."""
OBJECTIVE_HEADER = "x-llm-d-inference-objective"
"""The ``InferenceObjective`` (``llm-d.ai/v1alpha2``) whose priority band a request is in."""
current_flow: ContextVar[Flow | None] = ContextVar("queue_flow", default=None)
"""The flow of the request being served (None outside the HTTP path)."""


def request_class(tenant_class: int, priority: int | None, service_tier: str | None) -> int:
    """The class a request is queued in: its tenant's, lowered (never raised) by the request's
    ``priority`` (a class, higher first, as llm-d's ``InferenceObjective``) or by OpenAI's
    ``service_tier: flex`` (one class below the tenant's)."""
    level = tenant_class
    if service_tier == "flex":
        level -= 1
    if priority is not None:
        if priority > tenant_class:
            raise InvalidRequestError(
                f"priority {priority} is above your class ({tenant_class}); a request may "
                "lower its priority, not raise it.",
                param="priority",
            )
        level = min(level, priority)
    return level


def llm_d_headers(flow: Flow, objectives: Mapping[int, str]) -> dict[str, str]:
    """The headers llm-d's endpoint picker reads for ``flow``: its tenant as the fairness id,
    and the objective of the highest class in ``objectives`` at or below the flow's (none
    where every one is above it)."""
    headers = {FAIRNESS_HEADER: flow.tenant}
    classes = [level for level in objectives if level <= flow.priority_class]
    if classes:
        headers[OBJECTIVE_HEADER] = objectives[max(classes)]
    return headers
