"""The deploy spec of the sidecars, read once: ``serve`` reads it and hands it on."""

from __future__ import annotations

from pathlib import Path

from deploy.sidecar.spec import Spec, SpecError, load_spec, parse_spec
from gateway.settings import SettingsError, SidecarSettings


def parse_sidecar_spec(sidecars: SidecarSettings) -> Spec:
    """The deploy spec as written (built-in model names as they are); a file that is missing or
    a spec that cannot be served is a ``SettingsError`` naming the field."""
    try:
        if sidecars.spec is not None:
            if not Path(sidecars.spec).is_file():
                raise SettingsError(
                    f"sidecars.spec: the deploy spec {sidecars.spec} does not exist: write it "
                    "there, or point sidecars.spec at it (relative to the settings file)"
                )
            return load_spec(sidecars.spec)
        return parse_spec(sidecars.inline or {})
    except SpecError as exc:
        raise SettingsError(f"deploy spec: {exc}") from exc


def resolve_spec(spec: Spec) -> Spec:
    """``spec`` with built-in model names replaced by their folders (may convert a model)."""
    from deploy.sidecar.models import resolve_aliases

    return resolve_aliases(spec)


def read_spec(sidecars: SidecarSettings) -> Spec:
    """The deploy spec of the sidecars, built-in model names resolved (may convert a model)."""
    return resolve_spec(parse_sidecar_spec(sidecars))
