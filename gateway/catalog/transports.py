"""Which transport each served model takes to Triton, decided once at start from what the
operator wrote (each model's ``transport``, each sidecar's ``keep_responses``) and whether the
response keeper could be built, with the reason the start-up log and ``/metrics`` show.

``auto`` takes Triton's HTTP ``generate_stream`` only for a model of the supervised sidecars whose
tritonservers all run the response keeper: without it Triton's HTTP frontend loses responses
when it falls behind (docs/operations/response-keeper.md). A sidecar runs the keeper only where a
model it hosts may take HTTP, so a sidecar reached only over gRPC never loads it. Whichever the
model's transport, a request JSON cannot carry (LoRA weights sent with it, beams) or a BLS
request answered once goes over gRPC (``adapters.triton.client``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from deploy.sidecar.spec import SidecarSpec, Spec
from gateway.settings import ModelSettings, Settings, sidecar_served

logger = logging.getLogger(__name__)

TransportReason = Literal["settings", "keeper", "keeper_off", "keeper_unbuilt", "not_supervised"]
"""Why a model takes its transport, as the ``reason`` label of ``/metrics`` reads."""


@dataclass(frozen=True)
class TransportChoice:
    """One served model's transport to Triton and why."""

    model: str
    transport: Literal["grpc", "http"]
    reason: TransportReason
    detail: str
    """The reason in words, for the start-up log."""
    warn: bool = False
    """HTTP asked for on a sidecar that runs without the keeper: responses may be lost."""


def served_models(settings: Settings, spec: Spec | None) -> tuple[ModelSettings, ...]:
    """The models the settings serve: those listed, else every pipeline of the spec."""
    if settings.models or spec is None:
        return settings.models
    return tuple(ModelSettings(name=m.name, pipeline=m.name) for m in spec.models)


def _hosts(spec: Spec, pipeline: str) -> list[SidecarSpec]:
    return [s for s in spec.sidecars if pipeline in {m.name for m in spec.models_of(s)}]


def keeper_sidecars(settings: Settings, spec: Spec) -> frozenset[str]:
    """The sidecars whose tritonserver is to run the response keeper: ``keep_responses`` on in
    the spec, and hosting a pipeline of a model that may take HTTP (``http``, or ``auto``)."""
    wanted: set[str] = set()
    for model in served_models(settings, spec):
        if model.transport == "grpc" or not sidecar_served(model) or model.pipeline is None:
            continue
        wanted.update(s.name for s in _hosts(spec, model.pipeline) if s.keep_responses)
    return frozenset(wanted)


def build_keepers(settings: Settings, spec: Spec) -> dict[str, Path | None]:
    """The response keeper for each sidecar of the spec, built once for all that run it (None
    for a sidecar without it: switched off, reached only over gRPC, or no C compiler here)."""
    wanted = keeper_sidecars(settings, spec)
    built: Path | None = None
    if wanted:
        from deploy.sidecar.frontend import keeper

        built = keeper.build()
    return {s.name: built if s.name in wanted else None for s in spec.sidecars}


def choose_transports(
    settings: Settings, spec: Spec | None, kept: Collection[str]
) -> tuple[TransportChoice, ...]:
    """Each served model's transport; ``kept`` names the sidecars running the keeper (pure)."""
    return tuple(_choose(model, spec, kept) for model in served_models(settings, spec))


def _choose(model: ModelSettings, spec: Spec | None, kept: Collection[str]) -> TransportChoice:
    name = model.name
    if model.transport == "grpc":
        return TransportChoice(name, "grpc", "settings", "transport: grpc in its settings")
    hosts = (
        _hosts(spec, model.pipeline)
        if spec is not None and model.pipeline is not None and sidecar_served(model)
        else None
    )
    if not hosts:
        if model.transport == "http":
            detail = "transport: http in its settings, for a Triton the gateway does not start"
            return TransportChoice(name, "http", "settings", detail)
        detail = "a Triton the gateway does not start (transport: http takes HTTP there)"
        return TransportChoice(name, "grpc", "not_supervised", detail)
    if all(s.name in kept for s in hosts):
        detail = "its sidecars' tritonservers run the response keeper"
        if model.transport == "http":
            return TransportChoice(name, "http", "settings", f"transport: http; {detail}")
        return TransportChoice(name, "http", "keeper", detail)
    off = [s.name for s in hosts if not s.keep_responses]
    reason: TransportReason = "keeper_off" if off else "keeper_unbuilt"
    lacks = (
        f"keep_responses: false on sidecar {', '.join(off)}"
        if off
        else "the response keeper could not be built (no C compiler; the log says why)"
    )
    if model.transport == "http":
        detail = f"transport: http in its settings, and {lacks}: responses may be lost"
        return TransportChoice(name, "http", reason, detail, warn=True)
    return TransportChoice(name, "grpc", reason, lacks)


def log_choices(choices: Iterable[TransportChoice]) -> None:
    """One start-up line per model: its transport and why."""
    for choice in choices:
        level = logging.WARNING if choice.warn else logging.INFO
        logger.log(
            level, "model %s reaches Triton over %s: %s", choice.model, choice.transport,
            choice.detail,
        )  # fmt: skip
