"""A split model's two pools from its pipeline's sidecars: the context sidecars become its
context pool, the generation sidecars its replicas (pure)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from deploy.sidecar.spec import Spec
from gateway.replicas.settings import EndpointSettings, RoutingSettings
from gateway.replicas.sources import ReplicaAddress
from gateway.settings import ModelSettings, SettingsError


def sidecar_pools(
    model: ModelSettings,
    spec: Spec | None,
    hosts: Sequence[ReplicaAddress],
    *,
    takes_http: bool,
) -> tuple[tuple[ReplicaAddress, ...], RoutingSettings]:
    """The replicas of a model on its pipeline's sidecars (``hosts``, named as the sidecars),
    and its routing: where the pipeline runs on context and generation sidecars, the
    generation ones, and ``routing.disaggregation`` naming the context ones. A model on that
    pipeline without ``routing.disaggregation`` runs whole on the generation sidecars."""
    phases = {
        sidecar.name: sidecar.disaggregation.phase
        for sidecar in (spec.sidecars if spec is not None else ())
        if sidecar.disaggregation is not None
    }
    context = tuple(host for host in hosts if phases.get(host.name) == "context")
    split = model.routing.disaggregation
    if not context:
        if split is not None:
            raise SettingsError(
                f"model {model.name!r}: routing.disaggregation needs context and generation "
                f"sidecars, and pipeline {model.pipeline!r} runs whole on its sidecars: give "
                "them disaggregation: {phase: context} and {phase: generation} (with their "
                "KV-cache transfer settings) in the deploy spec"
            )
        return tuple(hosts), model.routing
    generation = tuple(host for host in hosts if phases.get(host.name) == "generation")
    if split is None:
        return generation, model.routing
    if split.context_replicas:
        raise SettingsError(
            f"model {model.name!r}: pipeline {model.pipeline!r} runs on context sidecars "
            f"{sorted(host.name for host in context)}, the model's context pool: leave "
            "routing.disaggregation.context_replicas out"
        )
    pool = tuple(
        EndpointSettings(
            url=host.url,
            metrics_url=host.metrics_url,
            name=host.name,
            http_url=host.http_url if takes_http else None,
        )
        for host in context
    )
    split = msgspec.structs.replace(split, context_replicas=pool)
    return generation, msgspec.structs.replace(model.routing, disaggregation=split)


def check_sidecar_pools(models: Sequence[ModelSettings], spec: Spec) -> None:
    """Refuse, before a sidecar starts, a model whose pools its pipeline's sidecars cannot be
    (as ``sidecar_pools`` would at start)."""
    for model in models:
        if model.replicas or model.triton_url is not None or model.pipeline is None:
            continue
        names = [
            sidecar.name
            for sidecar in spec.sidecars
            if model.pipeline in {hosted.name for hosted in spec.models_of(sidecar)}
        ]
        hosts = [ReplicaAddress(name, name) for name in names] if len(names) > 1 else []
        if hosts or model.routing.disaggregation is not None:
            sidecar_pools(model, spec, hosts, takes_http=False)
