"""The tenants and keys in force: the settings file's, with the run-time changes kept in Redis.

The rule: a change made through the admin API is kept in Redis and wins over the settings file
for the one tenant or key it touches, across restarts, until the API changes that tenant or key
again. Everything the API never touched comes from the file. So:

- a tenant created, replaced or patched at run time keeps its run-time policy, whatever the
  file says about it later;
- a tenant deleted at run time stays deleted although the file defines it, until it is created
  again through the API; deleting it revoked its keys, and they stay revoked;
- a key revoked at run time stays revoked although the file lists it;
- a key opens nothing while its tenant is not in force.

A restart never brings back a tenant or key that was taken away at run time, whatever an older
settings file says; the start log names every place where the run-time state overrides the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.tenancy.config import KeyEntry, TenancySettings, TenantPolicy


@dataclass(frozen=True, slots=True)
class RunTimeChanges:
    """What the admin API changed, as Redis keeps it."""

    tenants: Mapping[str, TenantPolicy] = field(default_factory=dict)
    """Tenants created, replaced or patched, by name."""
    keys: tuple[KeyEntry, ...] = ()
    """Keys made (and not revoked since)."""
    revoked: frozenset[str] = frozenset()
    """Digests of the revoked keys."""
    deleted: frozenset[str] = frozenset()
    """Names of the deleted tenants (not created again since)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Tenants by name and the keys that open them, as of one moment."""

    tenants: dict[str, TenantPolicy]
    keys: dict[str, KeyEntry]
    """The keys by their digest (``KeyEntry.sha256``)."""


def in_force(settings: TenancySettings, changes: RunTimeChanges | None = None) -> Snapshot:
    """The tenants and keys that work: the file's, with the run-time changes applied."""
    changes = changes or RunTimeChanges()
    tenants = {t.name: t for t in settings.tenants if t.name not in changes.deleted}
    tenants.update(changes.tenants)
    keys = [
        key
        for key in (*settings.keys, *changes.keys)
        if key.sha256 not in changes.revoked and key.tenant in tenants
    ]
    return Snapshot(tenants, {key.sha256: key for key in keys})


def differences(settings: TenancySettings, changes: RunTimeChanges) -> list[str]:
    """Where the run-time changes override the settings file, one line each."""
    return _tenant_differences(settings, changes) + _key_differences(settings, changes)


def _tenant_differences(settings: TenancySettings, changes: RunTimeChanges) -> list[str]:
    filed = {tenant.name: tenant for tenant in settings.tenants}
    lines = [
        f"tenant {name}: deleted at run time; the settings file's definition is not in force"
        for name in sorted(changes.deleted & filed.keys())
    ]
    for name, policy in sorted(changes.tenants.items()):
        own = filed.get(name)
        if own is None:
            lines.append(f"tenant {name}: created at run time (the settings file has none)")
        elif own != policy:
            fields = [f for f in policy.__struct_fields__ if getattr(own, f) != getattr(policy, f)]
            lines.append(
                f"tenant {name}: the run-time policy is in force; it differs from the settings "
                f"file's in {', '.join(fields)}"
            )
    return lines


def _key_differences(settings: TenancySettings, changes: RunTimeChanges) -> list[str]:
    tenants = in_force(settings, changes).tenants
    lines = []
    for key in settings.keys:
        if key.sha256 in changes.revoked:
            lines.append(
                f"key {key.key_id} of tenant {key.tenant}: revoked at run time; the settings "
                "file's entry is not in force"
            )
        elif key.tenant not in tenants:
            lines.append(
                f"key {key.key_id} of tenant {key.tenant}: in the settings file, but its tenant "
                "was deleted at run time"
            )
    made = [k for k in changes.keys if k.tenant in tenants and k.sha256 not in changes.revoked]
    if made:
        lines.append(f"{len(made)} key(s) made at run time are in force")
    return lines
