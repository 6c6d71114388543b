"""Which addresses an image fetch may reach, and the resolvers that turn a host into addresses.

An address is public when it is globally routable and nothing else: not loopback, private,
shared (CGNAT), link-local (169.254.169.254, the cloud metadata service, among them), multicast,
reserved, unspecified, documentation or benchmarking space. An IPv6 address that carries an
IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96`` and ``64:ff9b:1::/48``, 6to4
``2002::/16``) is judged by the IPv4 address it leads to; the deprecated IPv4-compatible form
(``::a.b.c.d``) and Teredo are refused.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64: Final = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE: Final = ipaddress.IPv6Network("::/96")
_SHARED_V4: Final = ipaddress.IPv4Network("100.64.0.0/10")
# Special-purpose blocks that older Pythons' ``is_global`` still counts as global.
_SPECIAL: Final = (
    ipaddress.IPv4Network("192.0.0.0/24"),
    ipaddress.IPv6Network("3fff::/20"),
    ipaddress.IPv6Network("5f00::/16"),
)


def is_public(address: IPAddress) -> bool:
    """Whether a fetch may connect to ``address`` when private networks are not allowed."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return _is_public_v4(embedded)
        if address in _IPV4_COMPATIBLE or address.teredo is not None or _special(address):
            return False
        return address.is_global and not (
            address.is_multicast
            or address.is_reserved
            or address.is_site_local
            or address.is_link_local
            or address.is_loopback
            or address.is_unspecified
        )
    return _is_public_v4(address)


def _is_public_v4(address: ipaddress.IPv4Address) -> bool:
    return (
        address.is_global
        and address not in _SHARED_V4
        and not _special(address)
        and not (
            address.is_multicast
            or address.is_reserved
            or address.is_link_local
            or address.is_loopback
            or address.is_unspecified
            or address.is_private
        )
    )


def _special(address: IPAddress) -> bool:
    return any(address in network for network in _SPECIAL)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one leads to, where it is a translation of one."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    for network in _NAT64:
        if address in network:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def literal_address(host: str) -> IPAddress | None:
    """The address a URL's host names directly, or None for a name to resolve."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


class HostResolver(Protocol):
    """Turns a host name into the addresses a connection may use, in the order to try them."""

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        """The addresses of ``host``; raises ``OSError`` when it has none."""
        ...


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """The operating system's answer (``getaddrinfo``), without blocking the event loop."""
    loop = asyncio.get_running_loop()
    answers = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in answers:
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if address not in found:
            found.append(address)
    return found


@dataclass(frozen=True)
class StaticResolver:
    """A resolver with a fixed table of names, for tests: a name it lacks does not resolve."""

    hosts: Mapping[str, Sequence[str]]

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        if host not in self.hosts:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} is not in the table")
        return [ipaddress.ip_address(address) for address in self.hosts[host]]
