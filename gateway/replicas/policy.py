"""The routing policies: which replica a request goes to, from what is known of each (pure).

``score`` adds weighted terms between 0 and 1 (as llm-d's endpoint picker does): idleness from
the requests in flight and the engine's waiting requests, free KV cache, prefix affinity and
adapter affinity. Affinity counts only on replicas within the bounded load (consistent hashing
with bounded loads): a replica whose load with this request would pass ``load_factor`` times the
mean, and more than ``load_slack`` requests over the least loaded, is chosen for its load
alone. Ties go round the tied replicas in turn. ``least_request``
and ``round_robin`` are there to compare against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.replicas.settings import Policy, ScoreWeights

_TIE = 1e-9


@dataclass(frozen=True, slots=True)
class Candidate:
    """One routable replica at the moment of a request: the score's inputs."""

    name: str
    in_flight: int
    """Requests this gateway has on the replica now."""
    waiting: float = 0.0
    """Waiting requests the engine reported (every client's)."""
    kv_fraction: float = 0.0
    """Share of the engine's KV-cache blocks in use."""
    prefix_blocks: int = 0
    """Leading blocks of the prompt this replica owns."""
    holds_adapter: bool = False
    """The replica holds the request's LoRA adapter."""
    adapter_room: bool = False
    """The replica's LoRA cache has room for another adapter."""

    @property
    def load(self) -> float:
        """The queue the request would join."""
        return self.in_flight + self.waiting


@dataclass(frozen=True, slots=True)
class Request:
    """What the policy needs of the request itself."""

    prompt_blocks: int = 0
    """Full leading blocks of the prompt."""
    adapter: bool = False
    """Whether the request names a LoRA adapter."""


def within_bound(
    candidates: Sequence[Candidate], load_factor: float, load_slack: float = 0.0
) -> list[bool]:
    """Whether each replica may take the request for affinity: its load plus this request stays
    within ``ceil(load_factor * mean load)`` (this request counted in the mean), or within
    ``load_slack`` of the least loaded replica's (a few requests are no imbalance)."""
    loads = [candidate.load for candidate in candidates]
    cap = math.ceil(load_factor * (sum(loads) + 1) / len(loads))
    least = min(loads)
    return [load + 1 <= cap or load - least <= load_slack for load in loads]


def scores(
    candidates: Sequence[Candidate],
    request: Request,
    weights: ScoreWeights,
    load_factor: float,
    load_slack: float = 0.0,
) -> list[float]:
    """Each replica's score under the ``score`` policy."""
    busiest = max(candidate.load for candidate in candidates)
    bounded = within_bound(candidates, load_factor, load_slack)
    result = []
    for candidate, affine in zip(candidates, bounded, strict=True):
        score = weights.queue * (1 - candidate.load / (busiest + 1))
        score += weights.kv_cache * (1 - min(max(candidate.kv_fraction, 0.0), 1.0))
        if affine and request.prompt_blocks:
            score += weights.prefix * candidate.prefix_blocks / request.prompt_blocks
        if affine and request.adapter:
            room = 0.5 if candidate.adapter_room else 0.0
            score += weights.adapter * (1.0 if candidate.holds_adapter else room)
        result.append(score)
    return result


def _best(values: Sequence[float], turn: int) -> int:
    top = max(values)
    tied = [index for index, value in enumerate(values) if value >= top - _TIE]
    return tied[turn % len(tied)]


def choose(
    policy: Policy,
    candidates: Sequence[Candidate],
    request: Request,
    *,
    weights: ScoreWeights,
    load_factor: float,
    load_slack: float = 0.0,
    turn: int,
) -> int:
    """The index of the replica to send the request to; ``turn`` counts requests, for ties."""
    if not candidates:
        raise ValueError("no candidates")
    if policy == "round_robin":
        return turn % len(candidates)
    if policy == "least_request":
        return _best([-candidate.in_flight for candidate in candidates], turn)
    return _best(scores(candidates, request, weights, load_factor, load_slack), turn)
