"""Configuration of tenants, their API keys and limits, and the store that shares the limits."""

from __future__ import annotations

import fnmatch
import re
from typing import Literal

import msgspec

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
LIMITS = (
    "requests_per_minute",
    "tokens_per_minute",
    "tokens_per_day",
    "max_concurrency",
    "max_tokens",
    "max_choices",
)
"""The policy's limits: each one is a positive whole number, or unset (no limit)."""


class TenantPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one tenant may use, and how fast. Unset limits do not apply."""

    name: str
    """Tenant name; shows in metrics and logs."""
    models: tuple[str, ...] = ("*",)
    """Public model names the tenant may use; shell patterns (``llama-*``, ``*``) allowed."""
    adapters: tuple[str, ...] = ("*",)
    """LoRA adapter names the tenant may use, as patterns."""
    requests_per_minute: int | None = None
    """Requests per minute."""
    tokens_per_minute: int | None = None
    """Prompt plus completion tokens per minute."""
    tokens_per_day: int | None = None
    """Prompt plus completion tokens per day."""
    max_concurrency: int | None = None
    """Engine sequences in flight at once (a request of ``n`` choices holds ``n``)."""
    max_tokens: int | None = None
    """Largest completion one choice may ask for; also the most a request that names no
    ``max_tokens`` gets."""
    max_choices: int | None = None
    """Most engine sequences one request may start (prompts times ``n``, or times the beam
    width); overrides ``limits.bounds.max_choices`` for this tenant."""
    priority: int = 0
    """Triton request priority (1 is the highest level; 0 means the model's default); takes
    effect where the model config declares ``priority_levels``."""
    burst: float = 1.0
    """Share of a minute's quota that can be spent at once (0 < burst <= 1); the rest refills
    smoothly."""

    def allows_model(self, name: str) -> bool:
        """Whether the tenant may use the model called ``name``."""
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.models)

    def allows_adapter(self, name: str) -> bool:
        """Whether the tenant may use the LoRA adapter called ``name``."""
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.adapters)


class KeyEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One API key, stored only as the SHA-256 of the key."""

    tenant: str
    """The tenant the key belongs to."""
    sha256: str
    """Hex SHA-256 of the key (``triton-gateway keys new`` prints it)."""
    name: str = ""
    """What the key is for, shown by the admin API."""

    @property
    def key_id(self) -> str:
        """Short public id of the key: the first 12 hex digits of its hash."""
        return self.sha256[:12]


class StoreSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where limits are counted: in this process, or in Redis shared by every replica."""

    kind: Literal["memory", "redis"] = "memory"
    """``memory`` (one process) or ``redis`` (several replicas share the limits)."""
    url: str = "redis://127.0.0.1:6379/0"
    """Redis URL (``redis://``, ``rediss://``, ``unix://``)."""
    timeout_s: float = 0.25
    """Longest a Redis call may take before the failure policy applies."""
    on_failure: Literal["open", "closed"] = "open"
    """With Redis unreachable: admit without limits (``open``) or answer 503 (``closed``)."""
    prefix: str = "tgw"
    """Prefix of every Redis key."""
    lease_ttl_s: float = 30.0
    """A concurrency lease expires this long after its gateway stops renewing it."""
    refresh_s: float = 0.25
    """How often replicas look for tenants and keys changed through the admin API."""
    send_ahead: bool = True
    """Send the request of a tenant that Redis's last answer left far from its limits to Triton
    before its admission is answered, stopping it there should the answer refuse; ``false``:
    every request waits for its answer, and a refused one never reaches Triton."""


class TenancySettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """API keys, tenants and limits."""

    auth: bool = True
    """Require an API key; turning it off serves everyone as tenant ``anonymous``."""
    admin_key_sha256: str | None = None
    """SHA-256 of the key of the ``/admin`` API (never a tenant key)."""
    tenants: tuple[TenantPolicy, ...] = ()
    """Tenants and their policies."""
    keys: tuple[KeyEntry, ...] = ()
    """API keys and their tenants."""
    anonymous: TenantPolicy = TenantPolicy(name="anonymous")
    """The policy of every request while ``auth`` is off."""
    store: StoreSettings = StoreSettings()
    """Where limits are counted."""


class TenancyConfigError(ValueError):
    """Tenancy settings that contradict themselves."""


class PolicyError(TenancyConfigError):
    """A tenant policy that cannot work; ``field`` names the offending field."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def check_tenancy(settings: TenancySettings) -> None:
    """Reject settings that would fail at the first request instead of at start-up."""
    names = [tenant.name for tenant in settings.tenants]
    for tenant in (*settings.tenants, settings.anonymous):
        check_policy(tenant)
    if len(set(names)) != len(names):
        raise TenancyConfigError(f"tenant names appear twice: {sorted(names)}")
    for key in settings.keys:
        if not SHA256.match(key.sha256):
            raise TenancyConfigError(
                f"key {key.name or key.sha256!r}: sha256 must be 64 hex digits"
            )
        if key.tenant not in names:
            raise TenancyConfigError(f"key {key.key_id} names unknown tenant {key.tenant!r}")
    if settings.admin_key_sha256 is not None and not SHA256.match(settings.admin_key_sha256):
        raise TenancyConfigError("admin_key_sha256 must be 64 hex digits")
    if settings.admin_key_sha256 in {key.sha256 for key in settings.keys}:
        raise TenancyConfigError("the admin key must not also be a tenant key")
    if settings.auth and not settings.keys and settings.admin_key_sha256 is None:
        raise TenancyConfigError(
            "auth is on but no API keys are configured: add tenancy.tenants and tenancy.keys "
            "(triton-gateway keys new --tenant NAME), or set tenancy.auth: false to serve "
            "without keys"
        )


def check_policy(tenant: TenantPolicy) -> None:
    """Reject a policy that cannot work."""
    if not NAME.match(tenant.name):
        raise PolicyError(f"tenant name {tenant.name!r} must match {NAME.pattern}", "name")
    for field in LIMITS:
        value = getattr(tenant, field)
        if value is not None and value < 1:
            raise PolicyError(f"tenant {tenant.name!r}: {field} must be at least 1", field)
    if not 0 < tenant.burst <= 1:
        raise PolicyError(f"tenant {tenant.name!r}: burst must be in (0, 1]", "burst")
