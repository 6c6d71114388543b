"""Where a model's replicas are: a list of endpoints, a DNS name, or supervised sidecars."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway.replicas.settings import EndpointSettings

DNS_PREFIX = "dns:"
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""Addresses a host name has now (``resolve_addresses`` in production)."""


class SourceError(ValueError):
    """A ``replicas`` value that names no replicas."""


@dataclass(frozen=True, slots=True)
class ReplicaAddress:
    """One Triton replica: its name in metrics and traces, gRPC address and metrics URL, and
    its HTTP address where its model's requests take Triton's HTTP ``generate_stream``."""

    name: str
    url: str
    metrics_url: str | None = None
    http_url: str | None = None


@dataclass(frozen=True, slots=True)
class DnsName:
    """Replicas behind a name re-resolved now and then (a Kubernetes headless Service)."""

    host: str
    port: int
    metrics_port: int
    http_port: int | None = None

    def endpoints(self, addresses: Sequence[str]) -> tuple[ReplicaAddress, ...]:
        """The replicas at the addresses the name resolved to."""
        return tuple(
            address_endpoint(address, self.port, self.metrics_port, self.http_port)
            for address in sorted(set(addresses))
        )


ReplicaSource = tuple[ReplicaAddress, ...] | DnsName


def _host(address: str) -> str:
    """An address as it is written in a URL: IPv6 in brackets."""
    try:
        is_v6 = isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address)
    except ValueError:
        is_v6 = False
    return f"[{address}]" if is_v6 else address


def address_endpoint(
    address: str, port: int, metrics_port: int, http_port: int | None = None
) -> ReplicaAddress:
    """The replica at one resolved address."""
    host = _host(address)
    url = f"{host}:{port}"
    return ReplicaAddress(name=url, url=url, metrics_url=f"http://{host}:{metrics_port}/metrics",
                    http_url=_http_url(host, http_port))  # fmt: skip


def _http_url(host: str, port: int | None) -> str | None:
    return f"http://{host}:{port}" if port is not None else None


def _split(url: str) -> tuple[str, int]:
    host, colon, port = url.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise SourceError(f"{url!r} is not host:port")
    return host, int(port)


def endpoint_of(
    entry: str | EndpointSettings, metrics_port: int, http_port: int | None = None
) -> ReplicaAddress:
    """One listed replica, its metrics and HTTP URLs filled in from its host when not given."""
    settings = EndpointSettings(url=entry) if isinstance(entry, str) else entry
    host, _ = _split(settings.url)
    metrics_url = settings.metrics_url or f"http://{host}:{metrics_port}/metrics"
    http_url = settings.http_url or _http_url(host, http_port)
    name = settings.name or settings.url
    return ReplicaAddress(name=name, url=settings.url, metrics_url=metrics_url, http_url=http_url)


def parse_source(
    replicas: str | Sequence[str | EndpointSettings],
    metrics_port: int,
    http_port: int | None = None,
) -> ReplicaSource:
    """A model's ``replicas`` setting: ``dns:HOST:PORT`` or a list of endpoints (pure)."""
    if isinstance(replicas, str):
        if not replicas.startswith(DNS_PREFIX):
            raise SourceError(f"{replicas!r}: write a list of host:port endpoints or dns:HOST:PORT")
        host, port = _split(replicas.removeprefix(DNS_PREFIX).lstrip("/"))
        return DnsName(host=host, port=port, metrics_port=metrics_port, http_port=http_port)
    endpoints = tuple(endpoint_of(entry, metrics_port, http_port) for entry in replicas)
    names = [endpoint.name for endpoint in endpoints]
    if len(set(names)) != len(names):
        raise SourceError(f"replica names appear twice: {sorted(names)}")
    if not endpoints:
        raise SourceError("the list of replicas is empty")
    return endpoints


async def resolve_addresses(host: str, port: int) -> Sequence[str]:
    """The addresses ``host`` resolves to now (A and AAAA records, or /etc/hosts)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})
