"""Settings of the fair queue that a full model's requests wait in."""

from __future__ import annotations

import msgspec


class QueueSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How requests wait when a model is at its ``routing.max_in_flight`` (on every replica)."""

    enabled: bool = True
    """Queue requests when the model is full; ``false``: answer 503 with ``Retry-After`` at
    once, as without a queue."""
    max_queued: int = 64
    """Most requests of one tenant that may wait for one model at once (a tenant's own
    ``max_queued`` overrides it); one more is refused with 429."""
    max_queue_wait_s: float = 30.0
    """Longest a request waits for a slot; then 429 when its tenant was over its share, else
    503 (the model is full), both with ``Retry-After``."""
    half_life_s: float = 30.0
    """Half-life of a tenant's attained service: tokens served this long ago count half."""
    shared: bool = True
    """With a Redis tenancy store (several workers, several gateways), order every process's
    queue by the tenants' service across all of them; ``false``: each by its own."""
    sync_interval_s: float = 0.1
    """How often a process sends its charges to Redis and reads everyone's, while it has
    charges to send or requests waiting (one script call per model)."""


def check_queueing(settings: QueueSettings) -> list[str]:
    """What is wrong with ``settings`` (empty when nothing is)."""
    problems = []
    if settings.max_queued < 0:
        problems.append("max_queued must be >= 0")
    for name in ("max_queue_wait_s", "half_life_s", "sync_interval_s"):
        if getattr(settings, name) <= 0:
            problems.append(f"{name} must be > 0")
    return problems
