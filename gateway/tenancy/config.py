"""Configuration of tenants, their API keys and limits, and the store that shares the limits."""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import re
from pathlib import Path
from typing import Annotated, Literal

import msgspec

# Matched whole (``fullmatch``): ``$`` under ``re.match`` would also take a trailing newline.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SHA256 = re.compile(r"[0-9a-f]{64}")
KEY_NAME = re.compile(r"[\x20-\x7e]{0,128}")
"""What a key's name may be: up to 128 printable ASCII characters (it shows in listings)."""
MAX_PRIORITY = 100
"""The highest priority level a tenant may be given (Triton's levels are few; 1 is the top)."""
LIMITS = (
    "requests_per_minute",
    "tokens_per_minute",
    "tokens_per_day",
    "max_concurrency",
    "max_tokens",
    "max_choices",
)
"""The policy's limits: each one is a positive whole number, or unset (no limit)."""
PATTERN = re.compile(r"[*?[]")
"""What makes a model name a shell pattern rather than a name (``fnmatch``'s special
characters)."""


class TenantPolicy(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, dict=True
):
    """What one tenant may use, and how fast. Unset limits do not apply.

    What every request reads of a policy (``every_model``, ``model_names``, ``scope_salt``) is
    derived once per policy, on first use, and kept beside its fields (not encoded with them):
    a policy changed at run time is a new object, derived afresh.
    """

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
    """Triton request priority, 0 to 100 (1 is the highest level; 0 means the model's
    default); takes effect where the model config declares ``priority_levels``."""
    weight: float = 1.0
    """Share of a full model's tokens, relative to the other tenants waiting in the same
    class (``2``: twice a tenant of weight 1)."""
    priority_class: int = 0
    """Fair-queueing class, -100 to 100: a full model's waiting requests of a higher class
    are served before any of a lower one. A request may lower its own (``priority``,
    ``service_tier: flex``), never raise it."""
    max_queued: int | None = None
    """Most of the tenant's requests that may wait for one full model at once (0: none
    waits); unset, ``queueing.max_queued``."""
    burst: float = 1.0
    """Share of a minute's quota that can be spent at once (0 < burst <= 1); the rest refills
    smoothly."""
    cache_scope: str | None = None
    """The KV-cache scope the tenant's prompts are cached in: tenants naming the same scope
    reuse each other's cached prefixes (a public scope). Unset, the tenant has a scope of its
    own that no other tenant can name."""

    @functools.cached_property
    def scope_salt(self) -> int:
        """The 64-bit salt of the tenant's KV-cache scope, derived from the scope alone: a named
        scope and a tenant's own scope hash apart, whatever they are called."""
        return _scope_salt(*self._scope, None)

    def client_salt(self, client: str) -> int:
        """The scope's salt narrowed by a client's ``cache_salt``: it changes only the salt's
        lower bits, so no client salt reaches another scope."""
        return _scope_salt(*self._scope, client)

    @property
    def _scope(self) -> tuple[str, str]:
        return ("scope", self.cache_scope) if self.cache_scope else ("tenant", self.name)

    @functools.cached_property
    def every_model(self) -> bool:
        """Whether the tenant may use every model (``*`` among its ``models``)."""
        return "*" in self.models

    @functools.cached_property
    def model_names(self) -> frozenset[str]:
        """The model names the tenant's ``models`` give exactly, without a pattern."""
        return frozenset(name for name in self.models if not PATTERN.search(name))

    def allows_model(self, name: str) -> bool:
        """Whether the tenant may use the model called ``name``: ``every_model`` and
        ``model_names`` answer first, and only a name neither lets through is matched against
        the patterns."""
        return (
            self.every_model
            or name in self.model_names
            or any(fnmatch.fnmatchcase(name, pattern) for pattern in self.models)
        )

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

    kind: Literal["auto", "memory", "redis", "embedded"] = "auto"
    """``auto``: ``triton-gateway serve`` picks ``embedded``, kept in ``tenancy.rdb`` beside the
    settings file, where keys, tenants or an admin key are configured (or ``server.workers``
    is above one), and ``memory`` otherwise; an app built by ``create_app`` counts in
    ``memory``. ``memory``: limits counted in this process, tenants and keys only from this
    file (the admin API cannot change them; one worker only). ``redis``: the Redis at ``url``,
    shared by every replica. ``embedded``: a redis-server this gateway runs itself on a
    private socket, kept in the file ``path`` across restarts, so that the admin API's changes
    last with nothing to set up."""
    url: str = "redis://127.0.0.1:6379/0"
    """Redis URL (``redis://``, ``rediss://``, ``unix://``) of ``kind: redis``."""
    path: str | None = None
    """File the embedded store (``kind: embedded``) keeps its data in, relative to the settings
    file; unset, the data lasts until the gateway stops (``kind: auto`` sets it to
    ``tenancy.rdb`` beside the settings file)."""
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


class ResponseStoreSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How long and how many stored responses each tenant keeps."""

    ttl_s: Annotated[float, msgspec.Meta(gt=0)] = 86400.0
    """A stored response is forgotten this long after it was made (``previous_response_id``
    and ``GET /v1/responses/{id}`` then answer 404)."""
    max_per_tenant: Annotated[int, msgspec.Meta(ge=1)] = 1000
    """Most stored responses one tenant keeps; making one more forgets its oldest."""
    max_bytes_per_tenant: Annotated[int, msgspec.Meta(ge=1)] = 64 * 1024 * 1024
    """Most bytes of stored responses (each with the conversation before it) one tenant keeps;
    past it the oldest are forgotten (the newest is kept whatever its size)."""


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
    responses: ResponseStoreSettings = ResponseStoreSettings()
    """How long and how many stored responses (``/v1/responses``) each tenant keeps, in the
    same store as the limits."""


STORE_FILE = "tenancy.rdb"
"""The embedded store's file, beside the settings file, where ``kind: auto`` picks it."""


def tenancy_on(settings: TenancySettings) -> bool:
    """Whether the settings have tenants to keep: auth on, tenants or an admin key."""
    return settings.auth or bool(settings.tenants) or settings.admin_key_sha256 is not None


def resolve_store(
    settings: TenancySettings, *, settings_dir: Path | None, workers: int
) -> TenancySettings:
    """The store ``kind: auto`` means for a gateway served from a settings file in
    ``settings_dir`` (None: settings built in code) with ``workers`` processes: the embedded
    store, kept beside the file, where there are tenants to keep; the embedded store, kept
    nowhere, where only several workers need to share the limits; memory otherwise. Any other
    kind is the operator's word and is kept."""
    store = settings.store
    if store.kind != "auto":
        return settings
    if settings_dir is not None and tenancy_on(settings):
        path = store.path or str(settings_dir / STORE_FILE)
        store = msgspec.structs.replace(store, kind="embedded", path=path)
    elif workers > 1:
        store = msgspec.structs.replace(store, kind="embedded")
    else:
        store = msgspec.structs.replace(store, kind="memory")
    return msgspec.structs.replace(settings, store=store)


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
        check_key(key)
        if key.tenant not in names:
            raise TenancyConfigError(f"key {key.key_id} names unknown tenant {key.tenant!r}")
    if settings.admin_key_sha256 is not None and not SHA256.fullmatch(settings.admin_key_sha256):
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
    if not NAME.fullmatch(tenant.name):
        raise PolicyError(f"tenant name {tenant.name!r} must match {NAME.pattern}", "name")
    if not 0 <= tenant.priority <= MAX_PRIORITY:
        raise PolicyError(
            f"tenant {tenant.name!r}: priority must be between 0 and {MAX_PRIORITY}", "priority"
        )
    for field in LIMITS:
        value = getattr(tenant, field)
        if value is not None and value < 1:
            raise PolicyError(f"tenant {tenant.name!r}: {field} must be at least 1", field)
    if tenant.cache_scope is not None and not NAME.fullmatch(tenant.cache_scope):
        raise PolicyError(
            f"tenant {tenant.name!r}: cache_scope must match {NAME.pattern}", "cache_scope"
        )
    if not 0 < tenant.weight <= 1000:
        raise PolicyError(f"tenant {tenant.name!r}: weight must be in (0, 1000]", "weight")
    if not -MAX_PRIORITY <= tenant.priority_class <= MAX_PRIORITY:
        raise PolicyError(
            f"tenant {tenant.name!r}: priority_class must be between {-MAX_PRIORITY} and "
            f"{MAX_PRIORITY}",
            "priority_class",
        )
    if tenant.max_queued is not None and tenant.max_queued < 0:
        raise PolicyError(f"tenant {tenant.name!r}: max_queued must be at least 0", "max_queued")
    if not 0 < tenant.burst <= 1:
        raise PolicyError(f"tenant {tenant.name!r}: burst must be in (0, 1]", "burst")


def check_key(key: KeyEntry) -> None:
    """Reject a key entry whose fields could not be stored or shown as they are."""
    if not NAME.fullmatch(key.tenant):
        raise PolicyError(f"tenant name {key.tenant!r} must match {NAME.pattern}", "tenant")
    if not KEY_NAME.fullmatch(key.name):
        raise PolicyError("a key's name must be at most 128 printable ASCII characters", "name")
    if not SHA256.fullmatch(key.sha256):
        raise PolicyError(f"key {key.name or key.sha256!r}: sha256 must be 64 hex digits", "sha256")


SCOPE_BITS = 32
"""A salt's upper bits are its scope's alone (a client's ``cache_salt`` changes only the lower
ones), so an engine can tell whose requests are whose, e.g. to share its grammar compile slots
fairly between scopes, whatever salts clients send."""


def _scope_salt(kind: str, name: str, client: str | None) -> int:
    """The salt of a scope (``kind`` ``scope`` or ``tenant``), narrowed by a client's salt."""
    scope = _scope_hash(kind, name)
    if client is None:
        return scope
    narrowed = _hash(kind, name, "client", client)
    low = (1 << SCOPE_BITS) - 1
    return (scope & ~low) | (narrowed & low)


@functools.lru_cache(maxsize=4096)
def _scope_hash(kind: str, name: str) -> int:
    """A scope's 64-bit hash, computed once per scope rather than on every request."""
    return _hash(kind, name)


def _hash(*parts: str) -> int:
    digest = hashlib.blake2b(digest_size=8, person=b"kv-cache-scope")
    for part in parts:
        raw = part.encode()
        digest.update(len(raw).to_bytes(8, "little") + raw)
    return int.from_bytes(digest.digest(), "little")
