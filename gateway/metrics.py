"""Prometheus metrics on a per-app registry, and the ASGI middleware that records requests."""

from __future__ import annotations

import time
from collections.abc import Callable

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class GatewayMetrics:
    """Request, latency and token metrics of one app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gateway_requests",
            "HTTP requests answered, by route, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "Time from request to the last byte of the answer.",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "gateway_requests_in_flight", "Requests being answered.", registry=self.registry
        )
        self.time_to_first_token = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from the generation's start to its first text.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "gateway_prompt_tokens", "Prompt tokens processed.", ["model"], registry=self.registry
        )
        self.completion_tokens = Counter(
            "gateway_completion_tokens",
            "Completion tokens generated.",
            ["model"],
            registry=self.registry,
        )

        self.rate_limited = Counter(
            "gateway_rate_limited",
            "Requests refused by a tenant limit, by tenant and limit.",
            ["tenant", "limit"],
            registry=self.registry,
        )
        self.limiter_unavailable = Counter(
            "gateway_limiter_unavailable",
            "Admissions while the rate-limit store was unreachable, by the policy applied.",
            ["policy"],
            registry=self.registry,
        )
        self.tenant_requests_in_flight = Gauge(
            "gateway_tenant_requests_in_flight",
            "Admitted requests of each tenant not yet settled, in this process.",
            ["tenant"],
            registry=self.registry,
        )
        self.tenant_tokens = Counter(
            "gateway_tenant_tokens",
            "Prompt plus completion tokens charged to each tenant.",
            ["tenant"],
            registry=self.registry,
        )

    def record_rate_limited(self, tenant: str, limit: str) -> None:
        """A limit refused a request of ``tenant``."""
        self.rate_limited.labels(tenant, limit).inc()

    def record_limiter_unavailable(self, policy: str) -> None:
        """An admission met an unreachable store and applied ``policy``."""
        self.limiter_unavailable.labels(policy).inc()

    def tenant_in_flight(self, tenant: str, change: int) -> None:
        """A request of ``tenant`` was admitted (+1) or settled (-1)."""
        self.tenant_requests_in_flight.labels(tenant).inc(change)

    def record_tenant_tokens(self, tenant: str, tokens: int) -> None:
        """A settled request of ``tenant`` used ``tokens``."""
        self.tenant_tokens.labels(tenant).inc(max(0, tokens))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def record_first_token(self, model: str, seconds: float) -> None:
        """A generation produced its first text ``seconds`` after it started."""
        self.time_to_first_token.labels(model).observe(seconds)

    def record_tokens(self, model: str, prompt: int, completion: int) -> None:
        """Token counts of one finished choice."""
        self.prompt_tokens.labels(model).inc(prompt)
        self.completion_tokens.labels(model).inc(completion)

    def middleware(
        self, on_start: Callable[[], None], on_end: Callable[[], None]
    ) -> Callable[[ASGIApp], ASGIApp]:
        """ASGI middleware counting requests; ``on_start``/``on_end`` track in-flight work."""

        def wrap(app: ASGIApp) -> ASGIApp:
            async def record(scope: Scope, receive: Receive, send: Send) -> None:
                if scope["type"] != ScopeType.HTTP:
                    await app(scope, receive, send)
                    return
                status = 500
                start = time.monotonic()

                async def capture(message: Message) -> None:
                    nonlocal status
                    if message["type"] == "http.response.start":
                        status = message["status"]
                    await send(message)

                route = scope.get("path_template") or "other"
                method = str(scope.get("method", ""))
                on_start()
                self.in_flight.inc()
                try:
                    await app(scope, receive, capture)
                finally:
                    self.in_flight.dec()
                    on_end()
                    self.requests.labels(route, method, str(status)).inc()
                    self.duration.labels(route, method).observe(time.monotonic() - start)

            return record

        return wrap
