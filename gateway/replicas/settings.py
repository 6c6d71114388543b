"""The ``replicas`` of a model and how requests are routed among them."""

from __future__ import annotations

from typing import Literal

import msgspec

Policy = Literal["score", "least_request", "round_robin"]


class EndpointSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One Triton replica given by its address."""

    url: str
    """Triton gRPC ``host:port``."""
    metrics_url: str | None = None
    """Triton's Prometheus metrics; defaults to ``http://<host>:<routing.metrics_port>/metrics``."""
    name: str | None = None
    """The replica's name in metrics and traces; defaults to ``url``."""
    http_url: str | None = None
    """Triton's HTTP address (``http://host:port``) for the model's ``transport: http``;
    defaults to ``routing.http_port`` on the replica's host."""


class ScoreWeights(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Weights of the ``score`` policy's terms, each term between 0 and 1."""

    queue: float = 2.0
    """Idleness: ``1 - load / (busiest load + 1)``, the load being the requests this gateway has
    in flight on the replica plus the engine's waiting requests."""
    kv_cache: float = 2.0
    """Free KV cache: ``1 -`` the scraped fraction of KV-cache blocks in use."""
    prefix: float = 3.0
    """Prefix affinity: the share of the prompt's leading blocks last routed to the replica."""
    adapter: float = 2.0
    """Adapter affinity: 1 where the replica holds the request's LoRA adapter; for an adapter no
    replica holds, 0.5 where the replica's LoRA cache has room for it; else 0."""


class DisaggregationSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A model's requests split in two (entry ``tensorrt_llm``): the prefill and first token on
    a context pool, the rest on the model's ``replicas`` (the generation pool), which take the
    prompt's KV cache from the context replica instead of prefilling it again."""

    context_replicas: tuple[str | EndpointSettings, ...] | str = ()
    """The context pool, written as ``replicas`` is: a list of endpoints or ``dns:HOST:PORT``;
    left out for a model whose pipeline runs on context and generation sidecars (their
    ``disaggregation.phase``), whose pools are those sidecars."""
    min_prompt_tokens: int = 0
    """Shorter prompts run whole on the generation pool: their prefill is not worth a
    handoff."""


class RoutingSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How requests of a model with several replicas are spread, and when a replica is out."""

    policy: Policy = "score"
    """``score`` (load, KV cache, prefix and adapter affinity), ``least_request`` (fewest
    requests in flight from this gateway) or ``round_robin``."""
    weights: ScoreWeights = ScoreWeights()
    """Weights of the ``score`` policy's terms."""
    load_factor: float = 1.5
    """Bounded load: affinity counts only on a replica whose load, with this request, stays
    within this factor of the mean load, so one hot prefix or adapter cannot swamp a replica."""
    load_slack: int = 8
    """...or whose load is at most this many requests over the least loaded replica's: a few
    requests more on the replica holding the prefix or adapter are no imbalance (SGLang's
    router uses both tests the same way)."""
    prefix_block_tokens: int = 64
    """Tokens per hashed prompt block until a replica reports its KV-cache block size
    (``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"}``)."""
    prefix_max_blocks: int = 128
    """Most leading blocks of a prompt that are hashed."""
    prefix_entries: int = 65536
    """Most prompt blocks remembered (least recently used forgotten first)."""
    adapter_slots: int = 8
    """LoRA adapters one replica's cache is taken to hold."""
    max_in_flight: int | None = None
    """Requests this gateway process keeps on one replica (or the model's one Triton) at most;
    more wait in the fair queue (``queueing``). Unset: no limit, no queue."""
    max_waiting: int | None = None
    """A replica whose engine reports this many waiting requests is saturated: it takes no
    more (with ``max_in_flight``, requests wait in the fair queue; without it, or with the
    queue off, a request finding every replica saturated gets 503 with ``Retry-After``)."""
    scrape_interval_s: float = 0.5
    """How often each replica's Triton metrics are read (queue, KV cache, block size)."""
    probe_interval_s: float = 1.0
    """How often each replica's readiness is asked."""
    probe_timeout_s: float = 1.0
    """How long a readiness probe or a metrics scrape may take."""
    probe_misses: int = 3
    """Probes in a row that time out before the replica is ejected (a loaded host answers
    late); a probe answered "not ready", or refused, ejects at once."""
    eject_s: float = 1.0
    """How long a failed replica is out before a probe may take it back; doubled each time that
    probe fails, up to ``max_eject_s``."""
    max_eject_s: float = 8.0
    """Longest time out between two probes of an ejected replica."""
    stall_s: float = 30.0
    """A replica with requests in flight and no tokens for this long is ejected as stalled."""
    resolve_interval_s: float = 5.0
    """How often a ``dns:`` name is resolved again."""
    metrics_port: int = 8002
    """Triton metrics port of replicas given by address (``dns:`` names, endpoints without
    ``metrics_url``)."""
    http_port: int | None = None
    """Triton HTTP port of replicas given by address (Triton's default is 8000), for the
    model's ``transport: http``."""
    inference_pool: bool = False
    """The model's Triton is reached through a Gateway API ``InferencePool`` with llm-d's
    endpoint picker: each request carries ``x-llm-d-inference-fairness-id`` (its tenant) and
    ``x-llm-d-inference-objective`` (see ``objectives``)."""
    objectives: dict[int, str] = {}
    """``InferenceObjective`` names by fair-queueing class, for ``inference_pool``: a request
    names the objective of the highest class at or below its own."""
    disaggregation: DisaggregationSettings | None = None
    """Run the context phase of long prompts on another pool (``disaggregation``), or None."""


def check_routing(routing: RoutingSettings) -> list[str]:
    """What is wrong with ``routing`` (empty when nothing is)."""
    problems = []
    positive = {
        "load_factor": routing.load_factor,
        "prefix_block_tokens": routing.prefix_block_tokens,
        "prefix_entries": routing.prefix_entries,
        "adapter_slots": routing.adapter_slots,
        "scrape_interval_s": routing.scrape_interval_s,
        "probe_interval_s": routing.probe_interval_s,
        "probe_timeout_s": routing.probe_timeout_s,
        "eject_s": routing.eject_s,
        "stall_s": routing.stall_s,
        "resolve_interval_s": routing.resolve_interval_s,
    }
    problems += [f"{name} must be > 0" for name, value in positive.items() if value <= 0]
    if routing.probe_misses < 1:
        problems.append("probe_misses must be >= 1")
    if routing.load_slack < 0:
        problems.append("load_slack must be >= 0")
    if routing.load_factor < 1:
        problems.append("load_factor must be >= 1")
    if routing.max_eject_s < routing.eject_s:
        problems.append("max_eject_s must be >= eject_s")
    for name, limit in (
        ("max_in_flight", routing.max_in_flight),
        ("max_waiting", routing.max_waiting),
    ):
        if limit is not None and limit < 1:
            problems.append(f"{name} must be >= 1")
    weights = msgspec.structs.asdict(routing.weights)
    problems += [f"weights.{name} must be >= 0" for name, value in weights.items() if value < 0]
    split = routing.disaggregation
    if split is not None and split.min_prompt_tokens < 0:
        problems.append("disaggregation.min_prompt_tokens must be >= 0")
    return problems
