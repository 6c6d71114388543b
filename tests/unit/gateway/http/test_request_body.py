"""The completion routes' body reader: the whole body however it arrives, a 413 as soon as it
announces or sends more than the limit, and a client that leaves while sending it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import ClientDisconnected, RequestTooLargeError
from gateway.http.answers import read_body


def _receiver(messages: list[dict[str, Any]]) -> Any:
    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    return receive


def _scope(length: int | None = None) -> Any:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "headers": headers}


def _parts(*parts: bytes) -> list[dict[str, Any]]:
    return [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]


async def test_a_body_in_parts_is_read_whole() -> None:
    body = await read_body(_scope(), _receiver(_parts(b'{"a"', b": 1", b"}")), limit=100)
    assert body == b'{"a": 1}'


async def test_a_body_of_exactly_the_limit_is_read() -> None:
    assert await read_body(_scope(4), _receiver(_parts(b"abcd")), limit=4) == b"abcd"


async def test_an_announced_length_over_the_limit_is_refused_before_reading() -> None:
    messages = _parts(b"abcde")
    with pytest.raises(RequestTooLargeError):
        await read_body(_scope(5), _receiver(messages), limit=4)
    assert len(messages) == 1, "nothing was read"


async def test_a_body_without_a_length_is_refused_once_it_passes_the_limit() -> None:
    messages = _parts(b"ab", b"cd", b"e", b"never read")
    with pytest.raises(RequestTooLargeError) as raised:
        await read_body(_scope(), _receiver(messages), limit=4)
    assert raised.value.status_code == 413
    assert messages == _parts(b"ab", b"cd", b"e", b"never read")[3:]


async def test_a_client_that_leaves_mid_body_is_a_disconnect() -> None:
    messages = [*_parts(b"ab", b"cd")[:1], {"type": "http.disconnect"}]
    with pytest.raises(ClientDisconnected):
        await read_body(_scope(), _receiver(messages), limit=100)
