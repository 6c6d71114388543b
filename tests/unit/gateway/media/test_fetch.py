"""The fetcher's rules, over httpx's MockTransport: vetted addresses, redirects, answers.

The transport stands in for the network, so these tests see what would be sent where: the
request's URL names the address connected to, its Host header the name asked for.
"""

from __future__ import annotations

import gzip
import ipaddress
from collections.abc import Callable

import httpx
import pytest

from gateway.media import ImageError, ImagePolicy, IPAddress, StaticResolver, check_image_url
from tests.support.images import encode, picture

PNG = encode(picture(), "PNG")
FETCH = ImagePolicy(fetch_http=True)
HOSTS = StaticResolver(
    {
        "images.test": ["93.184.216.34"],
        "cdn.test": ["2606:4700::6810:84e5", "93.184.216.35"],
        "internal.test": ["10.1.2.3"],
        "mixed.test": ["93.184.216.36", "127.0.0.1"],
        "metadata.test": ["169.254.169.254"],
    }
)


class Network:
    """A transport that records each request and answers with ``respond``."""

    def __init__(self, respond: Callable[[httpx.Request], httpx.Response]) -> None:
        self.requests: list[httpx.Request] = []
        self._respond = respond
        self.transport = httpx.MockTransport(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self._respond(request)


def image(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=PNG, headers={"Content-Type": "image/png"})


async def fetch(url: str, network: Network, policy: ImagePolicy = FETCH) -> bytes:
    return (await check_image_url(url, policy, resolver=HOSTS, transport=network.transport)).data


async def test_the_request_goes_to_the_vetted_address_with_the_hosts_name() -> None:
    network = Network(image)
    assert await fetch("http://images.test/cat.png?size=2", network) == PNG
    (request,) = network.requests
    assert str(request.url) == "http://93.184.216.34/cat.png?size=2"
    assert request.headers["host"] == "images.test"
    assert "image/png" in request.headers["accept"]
    assert "sni_hostname" not in request.extensions


async def test_https_sends_the_hosts_name_as_tls_server_name() -> None:
    network = Network(image)
    await fetch("https://cdn.test:8443/cat.png", network)
    (request,) = network.requests
    assert str(request.url) == "https://[2606:4700::6810:84e5]:8443/cat.png"
    assert request.headers["host"] == "cdn.test:8443"
    assert request.extensions["sni_hostname"] == "cdn.test"


@pytest.mark.parametrize(
    "url",
    [
        "http://internal.test/a.png",
        "http://mixed.test/a.png",  # one private address among public ones is enough
        "http://metadata.test/latest/meta-data/",
        "http://127.0.0.1/a.png",
        "http://[::1]:8080/a.png",
        "http://[::ffff:127.0.0.1]/a.png",
        "http://169.254.169.254/latest/meta-data/",
        "https://10.0.0.1/a.png",
        "http://[fe80::1]/a.png",
    ],
)
async def test_non_public_addresses_are_refused_before_connecting(url: str) -> None:
    network = Network(image)
    with pytest.raises(ImageError, match="not a public address"):
        await fetch(url, network)
    assert network.requests == []


async def test_private_networks_may_be_allowed() -> None:
    network = Network(image)
    policy = ImagePolicy(fetch_http=True, allow_private_networks=True)
    assert await fetch("http://internal.test/a.png", network, policy) == PNG
    assert network.requests[0].url.host == "10.1.2.3"


def redirect_to(location: str) -> Callable[[httpx.Request], httpx.Response]:
    def respond(request: httpx.Request) -> httpx.Response:
        if request.headers["host"] == "images.test":
            return httpx.Response(302, headers={"Location": location})
        return image(request)

    return respond


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("http://127.0.0.1:8080/secret", "not a public address"),
        ("http://[::1]/secret", "not a public address"),
        ("http://internal.test/secret", "not a public address"),
        ("http://metadata.test/latest/", "not a public address"),
        ("file:///etc/passwd", "unsupported image URL scheme 'file'"),
        ("gopher://images.test/", "unsupported image URL scheme 'gopher'"),
        ("data:image/png;base64,AAAA", "malformed URL"),
        ("data:,AAAA", "malformed URL"),
        ("http://[::1", "RemoteProtocolError"),
        ("http://user:secret@cdn.test/a.png", "credentials"),
        ("http://unknown.test/a.png", "could not be resolved"),
    ],
)
async def test_each_redirect_is_checked_like_the_first_url(location: str, message: str) -> None:
    network = Network(redirect_to(location))
    with pytest.raises(ImageError, match=message):
        await fetch("http://images.test/a.png", network)
    assert len(network.requests) == 1


async def test_a_relative_redirect_is_followed_on_a_fresh_resolution() -> None:
    network = Network(redirect_to("//cdn.test/b.png"))
    assert await fetch("https://images.test/a.png", network) == PNG
    first, second = network.requests
    assert (first.url.host, second.url.host) == ("93.184.216.34", "2606:4700::6810:84e5")
    assert str(second.url) == "https://[2606:4700::6810:84e5]/b.png"
    assert second.headers["host"] == "cdn.test"


@pytest.mark.parametrize(("redirects", "allowed"), [(0, 0), (2, 2), (3, 2), (4, 3)])
async def test_redirects_are_counted(redirects: int, allowed: int) -> None:
    def respond(request: httpx.Request) -> httpx.Response:
        left = int(request.url.params.get("left", "0"))
        if left:
            return httpx.Response(307, headers={"Location": f"/a.png?left={left - 1}"})
        return image(request)

    network = Network(respond)
    policy = ImagePolicy(fetch_http=True, max_redirects=allowed)
    url = f"http://images.test/a.png?left={redirects}"
    if redirects <= allowed:
        assert await fetch(url, network, policy) == PNG
    else:
        with pytest.raises(ImageError, match=f"redirected more than {allowed} times"):
            await fetch(url, network, policy)
    assert len(network.requests) == min(redirects, allowed) + 1


async def test_each_hop_resolves_its_host_once() -> None:
    """A second DNS answer (a rebinding to loopback) is never asked for, let alone used."""
    answers = iter([["93.184.216.34"], ["127.0.0.1"]])
    asked: list[str] = []

    async def rebinding(host: str, port: int) -> list[IPAddress]:
        asked.append(host)
        return [ipaddress.ip_address(a) for a in next(answers)]

    network = Network(image)
    loaded = await check_image_url(
        "http://images.test/a.png", FETCH, resolver=rebinding, transport=network.transport
    )
    assert loaded.data == PNG
    assert asked == ["images.test"]
    assert network.requests[0].url.host == "93.184.216.34"


async def test_the_next_address_is_tried_when_one_refuses_the_connection() -> None:
    def respond(request: httpx.Request) -> httpx.Response:
        if request.url.host != "93.184.216.35":
            raise httpx.ConnectError("connection refused", request=request)
        return image(request)

    network = Network(respond)
    assert await fetch("http://cdn.test/a.png", network) == PNG
    assert [r.url.host for r in network.requests] == ["2606:4700::6810:84e5", "93.184.216.35"]


async def test_no_address_answering_is_an_image_error() -> None:
    def respond(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ImageError, match="could not connect"):
        await fetch("http://cdn.test/a.png", Network(respond))


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (httpx.Response(404), "answered HTTP 404"),
        (httpx.Response(500, content=PNG), "answered HTTP 500"),
        (httpx.Response(302), "HTTP 302 without a Location"),
        (httpx.Response(304), "answered HTTP 304"),
        (
            httpx.Response(200, content=b"<html></html>", headers={"Content-Type": "image/png"}),
            "not a PNG, JPEG or WebP",
        ),
        (httpx.Response(200, content=b""), "empty"),
        (httpx.Response(200, content=PNG[:-10]), "decoded"),
    ],
)
async def test_bad_answers_are_image_errors(response: httpx.Response, message: str) -> None:
    with pytest.raises(ImageError, match=message):
        await fetch("http://images.test/a.png", Network(lambda request: response))


async def test_the_served_content_type_is_not_trusted() -> None:
    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=PNG, headers={"Content-Type": "text/html"})

    loaded = await check_image_url(
        "http://images.test/a", FETCH, resolver=HOSTS, transport=Network(respond).transport
    )
    assert loaded.media_type == "image/png"


@pytest.mark.parametrize(
    "url",
    ["http://user:secret@images.test/a.png", "http://user@images.test/a.png", "http:///a.png"],
)
async def test_urls_with_credentials_or_without_a_host_are_refused(url: str) -> None:
    network = Network(image)
    with pytest.raises(ImageError, match=r"credentials|no host"):
        await fetch(url, network)
    assert network.requests == []


async def test_a_name_that_does_not_resolve_is_an_image_error() -> None:
    with pytest.raises(ImageError, match=r"'nowhere\.test' could not be resolved"):
        await fetch("http://nowhere.test/a.png", Network(image))


async def test_a_body_over_the_limit_is_refused() -> None:
    policy = ImagePolicy(fetch_http=True, max_bytes=len(PNG) - 1)
    with pytest.raises(ImageError, match="larger than the limit"):
        await fetch("http://images.test/a.png", Network(image), policy)


async def test_the_image_is_asked_for_unencoded_and_a_compressed_answer_refused() -> None:
    network = Network(image)
    assert await fetch("http://images.test/a.png", network) == PNG
    assert network.requests[0].headers["accept-encoding"] == "identity"
    packed = gzip.compress(PNG)
    compressed = Network(
        lambda request: httpx.Response(200, content=packed, headers={"Content-Encoding": "gzip"})
    )
    with pytest.raises(ImageError, match="Content-Encoding 'gzip'"):
        await fetch("http://images.test/a.png", compressed)


async def test_https_never_redirects_to_plain_http() -> None:
    def respond(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/a.png":
            return httpx.Response(302, headers={"Location": request.url.params["to"]})
        return image(request)

    network = Network(respond)
    with pytest.raises(ImageError, match="redirected to a plain http URL"):
        await fetch("https://images.test/a.png?to=http://cdn.test/b.png", network)
    assert len(network.requests) == 1
    assert await fetch("https://images.test/a.png?to=https://cdn.test/b.png", network) == PNG
    assert await fetch("http://images.test/a.png?to=https://cdn.test/b.png", network) == PNG
