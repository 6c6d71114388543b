"""Fetching an image URL over http(s) without letting a client reach what it should not.

Every hop (the URL and each redirect) is checked the same way: http or https only, no
credentials in the URL, the host resolved once and every address it resolves to public (unless
the policy allows private networks). The connection then goes to a vetted address itself, with
the URL's host in the ``Host`` header and as the TLS server name, so a second DNS answer cannot
swap the address (DNS rebinding). Redirects are followed here, never by the HTTP client. One
deadline covers the whole fetch; the body is asked for unencoded (``Accept-Encoding:
identity``; a compressed answer is refused) and cut off at the size limit, checked first against
``Content-Length``, so the limit holds for the bytes on the wire. An https URL never redirects to
plain http. The served content type is not trusted: the decoder decides.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import httpx

from gateway.media.addresses import (
    HostResolver,
    IPAddress,
    is_public,
    literal_address,
    system_resolver,
)
from gateway.media.policy import ImageError, ImagePolicy

logger = logging.getLogger(__name__)

_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_ACCEPT: Final = "image/png, image/jpeg, image/webp"


async def fetch_image(
    url: str,
    policy: ImagePolicy,
    *,
    resolver: HostResolver = system_resolver,
    transport: httpx.AsyncBaseTransport | None = None,
) -> bytes:
    """The body of an image URL, following at most ``policy.max_redirects`` redirects.

    ``transport`` replaces the network (an ``httpx.MockTransport`` in tests); it receives
    requests addressed to the vetted IP address.
    """
    try:
        async with asyncio.timeout(policy.timeout_s):
            return await _follow(url, policy, resolver, transport)
    except (TimeoutError, httpx.TimeoutException):
        raise ImageError(
            f"fetching the image URL took longer than the limit of {policy.timeout_s:g} s"
        ) from None


async def _follow(
    url: str,
    policy: ImagePolicy,
    resolver: HostResolver,
    transport: httpx.AsyncBaseTransport | None,
) -> bytes:
    target = checked_url(url)
    for _hop in range(policy.max_redirects + 1):
        addresses = await _vetted_addresses(target, policy, resolver)
        # A client per hop: no connection, cookie or TLS session crosses from one host to another.
        async with httpx.AsyncClient(
            transport=transport,
            trust_env=False,
            follow_redirects=False,
            timeout=policy.timeout_s,
        ) as client:
            result = await _get(client, target, addresses, policy)
        if isinstance(result, bytes):
            return result
        target = _redirect_target(target, result)
    raise ImageError(f"the image URL redirected more than {policy.max_redirects} times")


def checked_url(url: str) -> httpx.URL:
    """The URL parsed, if it is an http(s) URL with a host and no credentials."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as error:
        raise ImageError(f"malformed image URL ({error})") from None
    if parsed.scheme not in ("http", "https"):
        scheme = parsed.scheme or "no scheme"
        raise ImageError(f"unsupported image URL scheme {scheme!r}; use http, https or data")
    if parsed.userinfo:
        raise ImageError("image URLs must not carry credentials (user:password@)")
    if not parsed.host:
        raise ImageError("the image URL has no host")
    return parsed


def _redirect_target(current: httpx.URL, location: str) -> httpx.URL:
    try:
        joined = current.join(location)
    except (httpx.InvalidURL, ValueError) as error:
        raise ImageError(f"the image URL redirected to a malformed URL ({error})") from None
    target = checked_url(str(joined))
    if current.scheme == "https" and target.scheme != "https":
        raise ImageError("the https image URL redirected to a plain http URL")
    return target


async def _vetted_addresses(
    target: httpx.URL, policy: ImagePolicy, resolver: HostResolver
) -> list[IPAddress]:
    host = target.raw_host.decode("ascii")
    literal = literal_address(host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            addresses = await resolver(host, _port(target))
        except OSError:
            raise ImageError(f"the image URL's host {host!r} could not be resolved") from None
        if not addresses:
            raise ImageError(f"the image URL's host {host!r} could not be resolved")
    if not policy.allow_private_networks:
        refused = [address for address in addresses if not is_public(address)]
        if refused:
            raise ImageError(
                f"the image URL's host {host!r} is not a public address ({refused[0]}); "
                "only public addresses may be fetched"
            )
    return addresses


def _port(target: httpx.URL) -> int:
    return target.port or (443 if target.scheme == "https" else 80)


async def _get(
    client: httpx.AsyncClient,
    target: httpx.URL,
    addresses: list[IPAddress],
    policy: ImagePolicy,
) -> bytes | str:
    """The body of a 2xx answer, or the ``Location`` of a redirect."""
    host = target.raw_host.decode("ascii")
    headers = {
        "Host": target.netloc.decode("ascii"),
        "Accept": _ACCEPT,
        "Accept-Encoding": "identity",
    }
    extensions = {"sni_hostname": host} if target.scheme == "https" else {}
    failure: httpx.TransportError | None = None
    for address in addresses:
        request = client.build_request(
            "GET",
            target.copy_with(host=str(address)),
            headers=headers,
            extensions=extensions,
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.ConnectError as error:
            logger.debug("image fetch: %s (%s) refused the connection: %s", host, address, error)
            failure = error
            continue
        except httpx.InvalidURL as error:  # httpx reads a redirect's Location as it answers
            raise ImageError(f"the image URL redirected to a malformed URL ({error})") from None
        except httpx.TransportError as error:
            raise ImageError(f"fetching the image URL failed ({type(error).__name__})") from None
        try:
            return await _answer(response, policy)
        finally:
            await response.aclose()
    raise ImageError(f"could not connect to the image URL's host {host!r} ({failure})")


async def _answer(response: httpx.Response, policy: ImagePolicy) -> bytes | str:
    status = response.status_code
    if status in _REDIRECTS:
        location = response.headers.get("location")
        if not location:
            raise ImageError(f"the image URL answered HTTP {status} without a Location")
        return str(location)
    if not 200 <= status < 300:
        raise ImageError(f"the image URL answered HTTP {status}")
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ImageError(
            f"the image URL answered with Content-Encoding {encoding!r}; images are fetched "
            "unencoded"
        )
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > policy.max_bytes:
        raise ImageError(f"the image is larger than the limit of {policy.max_bytes} bytes")
    body = bytearray()
    try:
        async for chunk in response.aiter_bytes():  # identity: the bytes on the wire
            body += chunk
            if len(body) > policy.max_bytes:
                raise ImageError(f"the image is larger than the limit of {policy.max_bytes} bytes")
    except httpx.TimeoutException:
        raise
    except httpx.HTTPError as error:
        raise ImageError(f"fetching the image URL failed ({type(error).__name__})") from None
    return bytes(body)
