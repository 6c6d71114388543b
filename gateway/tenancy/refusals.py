"""What a refused request's answer says: OpenAI's ``x-ratelimit-*`` headers and the 429 naming
the limit, with when to retry."""

from __future__ import annotations

import math

from gateway.errors import RateLimitError
from gateway.tenancy import gcra
from gateway.tenancy.config import TenantPolicy
from gateway.tenancy.quota import Quota, Rejected


def duration(seconds: float) -> str:
    """A duration as OpenAI writes it in ``x-ratelimit-reset-*``: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def rate_limit_headers(quota: Quota | None) -> dict[str, str]:
    """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for the limits that apply."""
    headers: dict[str, str] = {}
    for kind, entry in (("requests", quota and quota.requests), ("tokens", quota and quota.tokens)):
        if not entry:
            continue
        limit, decision = entry
        headers[f"x-ratelimit-limit-{kind}"] = str(gcra.whole(limit.rate))
        headers[f"x-ratelimit-remaining-{kind}"] = str(gcra.whole(decision.remaining))
        headers[f"x-ratelimit-reset-{kind}"] = duration(decision.reset_after)
    return headers


def rate_limit_error(tenant: TenantPolicy, rejected: Rejected) -> RateLimitError:
    """The 429 of a request a limit refused: which limit, and when to retry."""
    retry = max(rejected.retry_after, 0.001)
    headers = {
        **rate_limit_headers(rejected.quota),
        "Retry-After": str(math.ceil(retry)),
        "retry-after-ms": str(math.ceil(retry * 1000)),
    }
    what = {
        "requests": (f"requests per minute (limit {tenant.requests_per_minute})", "requests"),
        "tokens": (f"tokens per minute (limit {tenant.tokens_per_minute})", "tokens"),
        "tokens_per_day": (f"tokens per day (limit {tenant.tokens_per_day})", "tokens"),
        "concurrency": (
            f"sequences in flight at once (limit {tenant.max_concurrency})",
            "requests",
        ),
    }[rejected.limit]
    return RateLimitError(
        f"Rate limit reached for {what[0]} of tenant {tenant.name}. "
        f"Please try again in {duration(retry)}.",
        headers=headers,
        kind=what[1],
    )
