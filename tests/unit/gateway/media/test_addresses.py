"""Which addresses an image fetch may reach, and the resolvers."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from gateway.media import StaticResolver, is_public
from gateway.media.addresses import literal_address, system_resolver

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "2606:4700:4700::1111",
    "2001:4860:4860::8888",
    "::ffff:8.8.8.8",  # IPv4-mapped public address
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8
    "64:ff9b:1::808:808",  # local-use NAT64 of 8.8.8.8
    "2002:808:808::1",  # 6to4 of 8.8.8.8
]

REFUSED = [
    "127.0.0.1",
    "127.255.255.254",
    "0.0.0.0",
    "0.1.2.3",
    "10.0.0.1",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "100.64.0.1",  # shared address space (carrier-grade NAT)
    "169.254.169.254",  # cloud metadata service
    "169.254.0.1",
    "192.0.0.8",  # IETF protocol assignments
    "192.0.0.170",
    "192.0.2.1",  # documentation
    "198.18.0.1",  # benchmarking
    "198.51.100.7",
    "203.0.113.9",
    "224.0.0.1",  # multicast
    "239.255.255.250",
    "240.0.0.1",  # reserved
    "255.255.255.255",
    "::1",
    "::",
    "fe80::1",
    "fec0::1",  # deprecated site-local
    "fc00::1",
    "fd12:3456:789a::1",
    "ff02::1",  # multicast
    "ff0e::1",
    "2001:db8::1",  # documentation
    "2001::1",  # Teredo
    "100::1",  # discard-only
    "3fff::1",  # documentation (2024)
    "5f00::1",  # segment routing
    "::ffff:127.0.0.1",  # IPv4-mapped loopback
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "::127.0.0.1",  # IPv4-compatible (deprecated)
    "::8.8.8.8",
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b:1::a00:1",  # local-use NAT64 of 10.0.0.1
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:c0a8:101::1",  # 6to4 of 192.168.1.1
]


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_may_be_fetched(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", REFUSED)
def test_other_addresses_may_not(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]", "::1"),
        ("::ffff:7f00:1", "::ffff:7f00:1"),
        ("example.com", None),
        ("127.1", None),  # not a literal address: the resolver reads it (and finds 127.0.0.1)
    ],
)
def test_literal_addresses(host: str, expected: str | None) -> None:
    found = literal_address(host)
    assert (str(found) if found else None) == expected


async def test_the_system_resolver_finds_loopback_for_localhost() -> None:
    found = await system_resolver("localhost", 80)
    assert found
    assert all(address.is_loopback for address in found)
    assert len(found) == len(set(found))


async def test_the_system_resolver_reads_short_forms_of_addresses() -> None:
    assert [str(a) for a in await system_resolver("127.1", 80)] == ["127.0.0.1"]
    assert [str(a) for a in await system_resolver("2130706433", 80)] == ["127.0.0.1"]


async def test_the_static_resolver_answers_only_its_names() -> None:
    resolver = StaticResolver({"images.test": ["93.184.216.34", "2606:4700::1"]})
    assert [str(a) for a in await resolver("images.test", 443)] == [
        "93.184.216.34",
        "2606:4700::1",
    ]
    with pytest.raises(socket.gaierror):
        await resolver("other.test", 443)
