"""Image fetches from a real HTTP server on loopback: refused by default, fetched when private
networks are allowed, and cut off by the size, time and redirect limits."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.media import (
    ImageError,
    ImagePolicy,
    IPAddress,
    StaticResolver,
    check_image_url,
    is_public,
)
from gateway.media import fetch as fetch_module
from tests.support.image_server import ImageServer, serve_images
from tests.support.images import encode, picture

SOURCE = picture(9, 5, seed=3)
PNG = encode(SOURCE, "PNG")
FETCH = ImagePolicy(fetch_http=True)
PRIVATE = ImagePolicy(fetch_http=True, allow_private_networks=True)


@pytest.fixture(scope="module")
def server() -> Iterator[ImageServer]:
    with serve_images(PNG) as running:
        yield running


@pytest.fixture(autouse=True)
def fresh_log(server: ImageServer) -> None:
    server.seen.clear()


async def test_loopback_is_refused_by_default(server: ImageServer) -> None:
    with pytest.raises(ImageError, match="not a public address"):
        await check_image_url(server.url("/image"), FETCH)
    with pytest.raises(ImageError, match="not a public address"):
        await check_image_url(server.url("/image", host="localhost"), FETCH)
    assert server.seen == []


async def test_allowed_private_networks_fetch_the_image(server: ImageServer) -> None:
    loaded = await check_image_url(server.url("/image"), PRIVATE)
    assert loaded.data == PNG
    assert loaded.media_type == "image/png"
    assert (loaded.width, loaded.height) == SOURCE.size
    assert server.seen == [("/image", f"127.0.0.1:{server.port}")]


async def test_a_name_is_resolved_once_and_sent_as_the_host(server: ImageServer) -> None:
    resolver = StaticResolver({"images.test": ["127.0.0.1"]})
    url = server.url("/image", host="images.test")
    with pytest.raises(ImageError, match=r"'images\.test' is not a public address"):
        await check_image_url(url, FETCH, resolver=resolver)
    assert server.seen == []
    loaded = await check_image_url(url, PRIVATE, resolver=resolver)
    assert loaded.data == PNG
    assert server.seen == [("/image", f"images.test:{server.port}")]


@pytest.mark.parametrize("route", ["/sized", "/unsized"])
async def test_a_body_over_the_limit_is_cut_off(server: ImageServer, route: str) -> None:
    policy = ImagePolicy(fetch_http=True, allow_private_networks=True, max_bytes=50_000)
    with pytest.raises(ImageError, match="larger than the limit of 50000 bytes"):
        await check_image_url(server.url(f"{route}?n=5000000"), policy)
    with pytest.raises(ImageError, match="not a PNG"):  # under the limit: read, then decoded
        await check_image_url(server.url(f"{route}?n=50000"), policy)


async def test_a_stalled_server_runs_into_the_deadline(server: ImageServer) -> None:
    policy = ImagePolicy(fetch_http=True, allow_private_networks=True, timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(ImageError, match=r"longer than the limit of 0\.3 s"):
        await check_image_url(server.url("/stall"), policy)
    assert time.monotonic() - started < 10


async def test_redirects_are_followed_up_to_the_limit(server: ImageServer) -> None:
    assert (await check_image_url(server.url("/redirect?left=3"), PRIVATE)).data == PNG
    assert len(server.seen) == 4
    server.seen.clear()
    with pytest.raises(ImageError, match="redirected more than 3 times"):
        await check_image_url(server.url("/redirect?left=4"), PRIVATE)
    assert len(server.seen) == 4


async def test_a_redirect_to_loopback_is_refused_after_an_allowed_first_hop(
    server: ImageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first hop passes the address check (as a public host would); the redirect it answers
    with, to the loopback address, is checked again and refused."""
    judged: list[object] = []

    def first_hop_passes(address: IPAddress) -> bool:
        judged.append(address)
        return len(judged) == 1 or is_public(address)

    monkeypatch.setattr(fetch_module, "is_public", first_hop_passes)
    url = server.url(f"/to?url={server.url('/image')}")
    with pytest.raises(ImageError, match="not a public address"):
        await check_image_url(url, FETCH)
    assert [path for path, _host in server.seen] == [f"/to?url={server.url('/image')}"]
    assert len(judged) == 2
    assert (await check_image_url(url, PRIVATE)).data == PNG


async def test_an_error_status_is_named(server: ImageServer) -> None:
    with pytest.raises(ImageError, match="answered HTTP 404"):
        await check_image_url(server.url("/nothing"), PRIVATE)


async def test_a_closed_port_is_an_image_error(server: ImageServer) -> None:
    with pytest.raises(ImageError, match="could not connect"):
        await check_image_url("http://127.0.0.1:9/image", PRIVATE)


def _certificates(directory: Path, hostname: str) -> tuple[Path, Path, Path]:
    """A throwaway certificate authority and a certificate it signed for ``hostname``."""
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, request = directory / "cert.pem", directory / "cert.key", directory / "cert.csr"
    extensions = directory / "extensions.cnf"
    extensions.write_text(
        f"subjectAltName=DNS:{hostname}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    signed = ["-out", cert, "-days", "2", "-extfile", extensions]
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    commands = [
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=CA"],
        ["req", *ec, "-keyout", key, "-out", request, "-subj", f"/CN={hostname}"],
        ["x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", *signed],
    ]
    for command in commands:
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True)
    return ca, cert, key


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ImageServer, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the test certificates")
    ca, cert, key = _certificates(tmp_path_factory.mktemp("tls"), "images.test")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with serve_images(PNG, tls=context) as running:
        yield running, ca


async def test_https_verifies_the_hosts_name_on_a_connection_to_its_address(
    tls_server: tuple[ImageServer, Path],
) -> None:
    server, ca = tls_server
    resolver = StaticResolver({"images.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    trusting = httpx.AsyncHTTPTransport(verify=ssl.create_default_context(cafile=ca))
    loaded = await check_image_url(
        server.url("/image", host="images.test"), PRIVATE, resolver=resolver, transport=trusting
    )
    assert loaded.data == PNG
    assert server.server_names == ["images.test"]
    assert server.seen == [("/image", f"images.test:{server.port}")]
    with pytest.raises(ImageError, match="Hostname mismatch"):  # the certificate names images.test
        await check_image_url(
            server.url("/image", host="other.test"), PRIVATE, resolver=resolver, transport=trusting
        )
    assert len(server.seen) == 1
