"""What the request path asks of tenancy: who is calling, what they may use, and may they go now.

``authenticate`` turns the key a request presents into a tenant (401 otherwise); keys are made
at random and stored only as SHA-256 digests. ``admission`` reserves a request's worst case (its
prompt plus every choice's ``max_tokens``) against the tenant's limits in one store call, answered
while the request is prepared (``gateway.tenancy.admission``); its ticket meters what the request
really used and gives the rest back when its events end, whether they end normally, with an error
or because the client left. Every answer carries OpenAI's ``x-ratelimit-*`` headers.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Iterable, Mapping

from gateway.core.plan import Plan
from gateway.errors import (
    AuthenticationError,
    OversizeError,
    ServiceUnavailableError,
)
from gateway.ids import random_hex
from gateway.observability.metrics import GatewayMetrics
from gateway.tenancy.admission import Admission, TenantTicket, reservation, sequences
from gateway.tenancy.config import TenancySettings, TenantPolicy
from gateway.tenancy.directory import Directory
from gateway.tenancy.quota import (
    Limits,
    MemoryStore,
    Quota,
    Rejected,
    StoreUnavailable,
    far_from_limits,
    rate_limit_error,
    rate_limit_headers,
    requests_left,
    whole,
)
from gateway.tenancy.redis_store import open_store
from gateway.tenancy.responses_store import response_store

logger = logging.getLogger(__name__)

ADMIN_KEY_ON_API = (
    "This is the admin key, which serves the admin API only (/admin/* and the LoRA adapter "
    "endpoints); call the OpenAI API with a tenant's API key."
)
KEY_PREFIX = "tgw-"
MAX_KEY_LENGTH = 256
_AUTHORIZATION, _AZURE = "authorization", "api-key"
_CREDENTIALS = (_AUTHORIZATION.encode(), _AZURE.encode())
_MISSING_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization "
    "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the api-key header."
)


def new_key() -> str:
    """A fresh API key: the prefix and 256 random bits."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    """The hex SHA-256 of a key, the only form in which keys are stored."""
    return hashlib.sha256(key.encode()).hexdigest()


def matches(key: str, sha256: str | None) -> bool:
    """Whether ``key`` hashes to ``sha256``, compared in constant time."""
    return sha256 is not None and hmac.compare_digest(digest(key), sha256)


class MalformedKey(ValueError):
    """A credentials header that is present but not usable."""


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key of ``Authorization: Bearer <key>`` or of Azure's ``api-key: <key>``.

    Returns None when neither header is present; raises ``MalformedKey`` for a header that is
    there but holds no usable key.
    """
    authorization = headers.get(_AUTHORIZATION)
    if authorization is not None:
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise MalformedKey("the Authorization header must be `Bearer <key>`")
        return _checked(key.strip())
    azure = headers.get(_AZURE)
    return None if azure is None else _checked(azure.strip())


def credentials_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The headers ``presented_key`` reads, out of an ASGI scope's raw headers (the first of each
    name): all that authentication needs, without a mapping of every header."""
    found: dict[str, str] = {}
    for name, value in raw:
        name = name.lower()
        if name in _CREDENTIALS:
            found.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return found


def _checked(key: str) -> str:
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable() or " " in key:
        raise MalformedKey("the API key is malformed")
    return key


def required_key(headers: Mapping[str, str]) -> str:
    """The key the request presents; a 401 for none or a malformed one."""
    try:
        key = presented_key(headers)
    except MalformedKey as exc:
        raise AuthenticationError(f"Malformed API key: {exc}.") from None
    if key is None:
        raise AuthenticationError(_MISSING_KEY)
    return key


class Tenancy:
    """Keys, tenants and limits, in one service the routes depend on."""

    def __init__(self, settings: TenancySettings, metrics: GatewayMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or GatewayMetrics()
        store = settings.store
        self.store, client = open_store(store)
        self.redis = client
        """The store's Redis connection (None with the memory store), for what else the
        replicas share."""
        self.responses = response_store(settings.responses, client, prefix=store.prefix)
        """Stored responses, each tenant's its own, where the limits are kept."""
        self.directory = Directory(
            settings,
            client,
            prefix=store.prefix,
            refresh_s=store.refresh_s,
            timeout_s=store.timeout_s,
        )
        self._known: dict[str, Quota] = {}
        self._known_at: dict[str, float] = {}
        """When each tenant's last answer came (``time.monotonic``)."""
        self._unanswered: dict[str, tuple[int, int]] = {}
        """Per tenant, the admissions sent to the store and not answered yet: how many, and
        the tokens they reserve."""
        self._outage = False

    async def start(self) -> None:
        """Load run-time tenants and keys and start following changes."""
        await self.directory.start()

    async def close(self) -> None:
        """Stop following changes and close the store."""
        await self.directory.close()
        await self.store.close()

    def authenticate(self, headers: Mapping[str, str]) -> TenantPolicy:
        """The tenant the request's key opens; 401 for none, a malformed or an unknown key."""
        if not self.settings.auth:
            return self.settings.anonymous
        key = required_key(headers)
        snapshot = self.directory.snapshot
        wanted = digest(key)
        entry = snapshot.keys.get(wanted)
        tenant = None
        if entry is not None and hmac.compare_digest(entry.sha256, wanted):
            tenant = snapshot.tenants.get(entry.tenant)
        if tenant is None and matches(key, self.settings.admin_key_sha256):
            raise AuthenticationError(ADMIN_KEY_ON_API)
        if tenant is None:
            raise AuthenticationError("Incorrect API key provided.")
        return tenant

    def authenticate_admin(self, headers: Mapping[str, str]) -> None:
        """Let only the admin key through (a tenant key never); a 401 otherwise, or while the
        admin API is off (no ``admin_key_sha256``)."""
        admin_key_sha256 = self.settings.admin_key_sha256
        if admin_key_sha256 is None:
            raise AuthenticationError(
                "The admin API is off: set tenancy.admin_key_sha256 to turn it on."
            )
        if not matches(required_key(headers), admin_key_sha256):
            raise AuthenticationError("Incorrect admin API key provided.")

    def is_admin(self, headers: Mapping[str, str]) -> bool:
        """Whether the request carries the admin key."""
        try:
            key = presented_key(headers)
        except MalformedKey:
            return False
        return key is not None and matches(key, self.settings.admin_key_sha256)

    def cache_salt(
        self, tenant: TenantPolicy, *, shared: bool = False, client: str | None = None
    ) -> int | None:
        """The salt that keeps the tenant's cached prompts in its KV-cache scope, narrowed by
        the ``client``'s own ``cache_salt``. None where nothing is kept apart: no client salt,
        and auth off (every request is one tenant's) or a model whose cache its tenants share."""
        if client is not None:
            return tenant.client_salt(client)
        if shared or not self.settings.auth:
            return None
        return tenant.scope_salt

    def known_headers(self, tenant: TenantPolicy) -> dict[str, str]:
        """Rate-limit headers as of the tenant's last admission (for answers before one)."""
        return rate_limit_headers(self._known.get(tenant.name))

    async def admission(
        self, tenant: TenantPolicy, plan: Plan, headers: dict[str, str]
    ) -> Admission:
        """The plan's admission: decided (the memory store), or under way while the request is
        prepared (a shared store; see ``Admission``). Its rate-limit headers go into
        ``headers`` once admitted."""
        limits, tokens, width = Limits.of(tenant), reservation(plan), sequences(plan)
        bound_s = self.settings.store.timeout_s + 1.0
        if isinstance(self.store, MemoryStore):
            decided = await self._admit(tenant, limits, tokens, width)
            return Admission.decided(decided, headers, bound_s)
        self._check_fits(limits, tokens, width)
        name = tenant.name
        requests, reserved = self._unanswered.get(name, (0, 0))
        expected = (
            self.settings.store.send_ahead
            and not self._outage
            and far_from_limits(limits, self._known.get(name), reserved + tokens, requests + 1)
        )
        self._unanswered[name] = (requests + 1, reserved + tokens)
        # Expected to admit, the request goes to Triton first: its store command is written
        # when the admission's task first runs, a turn of the event loop later, once the
        # request has gone on its way (a write that wakes the store costs the writer a
        # hundred microseconds or more). Otherwise the command goes now, to be answered
        # while the Triton request is built.
        ticket = (
            self._sent_later(tenant, limits, tokens, width)
            if expected
            else self._sent(tenant, limits, tokens, width)
        )
        counted = self._counted(name, tokens, ticket)
        return Admission.pending(counted, headers, bound_s, expected=expected)

    async def _counted(
        self, name: str, tokens: int, ticket: Awaitable[TenantTicket]
    ) -> TenantTicket:
        """``ticket``, counted among the tenant's admissions waiting for their answer."""
        try:
            return await ticket
        finally:
            requests, reserved = self._unanswered.pop(name, (1, tokens))
            if requests > 1:
                self._unanswered[name] = (requests - 1, reserved - tokens)

    def admit(self, tenant: TenantPolicy, plan: Plan) -> Awaitable[TenantTicket]:
        """Reserve the plan's worst case against every limit of the tenant, or refuse it (when
        awaited). A shared store's command is on its way when this returns, so the result must
        be awaited and its ticket settled (``admission`` sees to both)."""
        return self._admit(tenant, Limits.of(tenant), reservation(plan), sequences(plan))

    async def count_refused(self, tenant: TenantPolicy, headers: dict[str, str]) -> None:
        """Count a request refused for its size against the tenant's request limit, so that
        refusals are not free: once the limit is spent this raises the 429 instead. Its
        rate-limit headers go into ``headers``; a store that cannot be asked counts nothing."""
        limit = Limits.of(tenant).requests
        if limit is None:
            return
        only_requests = Limits(requests=limit)
        lease = random_hex(16)
        try:
            quota = await self.store.admit(tenant.name, only_requests, 0, lease)
            await self.store.settle(tenant.name, only_requests, 0, lease)
        except Rejected as rejected:
            self.metrics.record_rate_limited(tenant.name, rejected.limit)
            self._remember(tenant, rejected.quota)
            raise rate_limit_error(tenant, rejected) from None
        except StoreUnavailable as exc:
            self._unavailable(exc, admitting=False)
            return
        self._remember(tenant, quota)
        headers.update(rate_limit_headers(quota))

    def refuse_if_spent(self, tenant: TenantPolicy) -> None:
        """The 429 at once, before the request's body is read, for a tenant whose last answer
        shows its request limit spent until now: a flood of large bodies costs no decoding."""
        known = self._known.get(tenant.name)
        if known is None or known.requests is None:
            return
        limits = Limits.of(tenant)
        elapsed = time.monotonic() - self._known_at.get(tenant.name, 0.0)
        limit = limits.requests
        left = requests_left(limits, known, elapsed)
        # Within the store's own rounding of a whole request: the store decides those.
        if left is None or left > 1 - 1e-6 or limit is None:
            return
        self.metrics.record_rate_limited(tenant.name, "requests")
        raise rate_limit_error(tenant, Rejected("requests", (1 - left) * limit.interval, known))

    def _remember(self, tenant: TenantPolicy, quota: Quota) -> None:
        self._known[tenant.name] = quota
        self._known_at[tenant.name] = time.monotonic()

    def _admit(
        self, tenant: TenantPolicy, limits: Limits, tokens: int, width: int
    ) -> Awaitable[TenantTicket]:
        self._check_fits(limits, tokens, width)
        return self._sent(tenant, limits, tokens, width)

    def _sent(
        self, tenant: TenantPolicy, limits: Limits, tokens: int, width: int
    ) -> Awaitable[TenantTicket]:
        """The ticket of a reservation that fits, its store command written now."""
        lease = random_hex(16)
        admitting = self.store.admit(tenant.name, limits, tokens, lease, width)
        return self._ticket(tenant, limits, tokens, lease, admitting)

    async def _sent_later(
        self, tenant: TenantPolicy, limits: Limits, tokens: int, width: int
    ) -> TenantTicket:
        """``_sent``, its command written once this is first awaited."""
        return await self._sent(tenant, limits, tokens, width)

    async def _ticket(
        self,
        tenant: TenantPolicy,
        limits: Limits,
        tokens: int,
        lease: str,
        admitting: Awaitable[Quota],
    ) -> TenantTicket:
        quota: Quota | None = None
        try:
            quota = await admitting
        except Rejected as rejected:
            self.metrics.record_rate_limited(tenant.name, rejected.limit)
            self._remember(tenant, rejected.quota)
            raise rate_limit_error(tenant, rejected) from None
        except StoreUnavailable as exc:
            self._unavailable(exc)
        else:
            self._recovered()
            self._remember(tenant, quota)
        self.metrics.tenant_in_flight(tenant.name, +1)
        return TenantTicket(self, tenant, limits, tokens, lease, quota)

    async def settle(self, ticket: TenantTicket, used: int) -> None:
        """The store side of ``TenantTicket.settle``; a store failure only costs the refund."""
        self.metrics.tenant_in_flight(ticket.tenant.name, -1)
        self.metrics.record_tenant_tokens(ticket.tenant.name, used)
        if ticket.quota is None:
            return
        try:
            await self.store.settle(
                ticket.tenant.name, ticket.limits, ticket.reserved - used, ticket.lease
            )
        except StoreUnavailable as exc:
            self._unavailable(exc, admitting=False)

    @staticmethod
    def _check_fits(limits: Limits, tokens: int, width: int) -> None:
        # The tenant's max_tokens was applied when the plan was made (planning's cap).
        if limits.concurrency is not None and width > limits.concurrency:
            raise OversizeError(
                f"This request runs {width} sequences at once, more than your "
                f"max_concurrency of {limits.concurrency} sequences in flight; lower n "
                "(or best_of), or send fewer prompts.",
                param="n",
            )
        room = limits.largest_reservation()
        if room is not None and tokens > room:
            raise OversizeError(
                f"This request can use up to {tokens} tokens (prompt plus max_tokens for each "
                f"choice), more than your token limit can ever hold ({whole(room)}); "
                "lower max_tokens or n.",
                param="max_tokens",
            )

    def _unavailable(self, exc: StoreUnavailable, *, admitting: bool = True) -> None:
        policy = self.settings.store.on_failure
        if not self._outage:
            self._outage = True
            logger.error(
                "the rate-limit store is unreachable (%s); failing %s until it is back",
                exc,
                policy,
            )
        if not admitting:
            return
        self.metrics.record_limiter_unavailable(policy)
        if policy == "closed":
            raise ServiceUnavailableError(
                "Rate limits cannot be checked right now; please retry.",
                code="rate_limiter_unavailable",
                headers={"Retry-After": "1"},
            ) from None

    def _recovered(self) -> None:
        if self._outage:
            self._outage = False
            logger.warning("the rate-limit store is reachable again")
