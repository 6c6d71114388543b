"""A tenant's policy as the admin API changes it: every field at once (PUT) or some (PATCH).

A field left out of a body and a field sent as ``null`` are different things: left out, it
stays as it is; ``null`` lifts that limit. So lowering one limit never resets the others, and a
``PUT`` that leaves fields out is refused rather than filled with defaults that would widen the
tenant.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

from gateway.tenancy.config import TenantPolicy, check_policy


class TenantFields(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A tenant's policy as the admin API takes it; the tenant's name is the path's.

    ``PUT`` must send every field; ``PATCH`` sends those it changes. A limit sent as ``null``
    is lifted; a field left out is kept.
    """

    models: tuple[str, ...] | UnsetType = UNSET
    """Public model names the tenant may use; shell patterns (``llama-*``, ``*``) allowed."""
    adapters: tuple[str, ...] | UnsetType = UNSET
    """LoRA adapter names the tenant may use, as patterns."""
    requests_per_minute: int | UnsetType | None = UNSET
    """Requests per minute; ``null`` for no limit."""
    tokens_per_minute: int | UnsetType | None = UNSET
    """Prompt plus completion tokens per minute; ``null`` for no limit."""
    tokens_per_day: int | UnsetType | None = UNSET
    """Prompt plus completion tokens per day; ``null`` for no limit."""
    max_concurrency: int | UnsetType | None = UNSET
    """Engine sequences in flight at once (a request of ``n`` choices holds ``n``); ``null``
    for no limit."""
    max_tokens: int | UnsetType | None = UNSET
    """Largest completion one choice may ask for, and the default of a request that names
    none; ``null`` for no cap."""
    max_choices: int | UnsetType | None = UNSET
    """Most engine sequences one request may start; ``null``: the gateway's
    ``limits.bounds.max_choices``."""
    priority: int | UnsetType = UNSET
    """Triton request priority (1 is the highest level; 0 means the model's default)."""
    weight: float | UnsetType = UNSET
    """Share of a full model's tokens, relative to the other tenants waiting in its class."""
    priority_class: int | UnsetType = UNSET
    """Fair-queueing class (-100 to 100): a full model serves a higher class first."""
    max_queued: int | UnsetType | None = UNSET
    """Most requests waiting for one full model at once; ``null``: ``queueing.max_queued``."""
    burst: float | UnsetType = UNSET
    """Share of a minute's quota that can be spent at once (0 < burst <= 1)."""
    cache_scope: str | UnsetType | None = UNSET
    """The KV-cache scope shared with the tenants that name it; ``null`` for the tenant's own."""


FIELDS: tuple[str, ...] = TenantFields.__struct_fields__
NARROWEST_BY_DEFAULT = frozenset({"cache_scope"})
"""Fields whose default is the narrowest policy (the tenant's own cache scope): a ``PUT`` may
leave them out."""


def sent(fields: TenantFields) -> dict[str, object]:
    """The fields a body sent, ``null`` ones included."""
    return {name: value for name in FIELDS if (value := getattr(fields, name)) is not UNSET}


def missing_fields(fields: TenantFields) -> list[str]:
    """The fields a body left out, in the policy's order."""
    return [
        name
        for name in FIELDS
        if getattr(fields, name) is UNSET and name not in NARROWEST_BY_DEFAULT
    ]


def apply_fields(policy: TenantPolicy, fields: TenantFields) -> TenantPolicy:
    """``policy`` with the fields that were sent replaced, checked (``PolicyError`` if it
    cannot work)."""
    changed = msgspec.structs.replace(policy, **sent(fields))
    check_policy(changed)
    return changed
