"""API keys: made at random, stored as SHA-256 digests, found with a constant-time comparison;
the key a request presents, and the admin key's checks."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping

from gateway.errors import AuthenticationError
from gateway.tenancy.config import KeyEntry

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


class KeyRing:
    """Key digests and what they open; a lookup never reveals a stored digest through timing."""

    def __init__(self, entries: Iterable[KeyEntry] = ()) -> None:
        self._entries = {entry.sha256: entry for entry in entries}

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[KeyEntry]:
        """Every entry of the ring."""
        return list(self._entries.values())

    def find(self, key: str) -> KeyEntry | None:
        """The entry of ``key``, if it is one of the ring's keys."""
        wanted = digest(key)
        entry = self._entries.get(wanted)
        if entry is None or not hmac.compare_digest(entry.sha256, wanted):
            return None
        return entry


def matches(key: str, sha256: str | None) -> bool:
    """Whether ``key`` hashes to ``sha256``, compared in constant time."""
    return sha256 is not None and hmac.compare_digest(digest(key), sha256)


def required_key(headers: Mapping[str, str]) -> str:
    """The key the request presents; a 401 for none or a malformed one."""
    try:
        key = presented_key(headers)
    except MalformedKey as exc:
        raise AuthenticationError(f"Malformed API key: {exc}.") from None
    if key is None:
        raise AuthenticationError(_MISSING_KEY)
    return key


def check_admin_key(headers: Mapping[str, str], admin_key_sha256: str | None) -> None:
    """Let only the admin key through (a tenant key never); a 401 otherwise, or while the admin
    API is off (no ``admin_key_sha256``)."""
    if admin_key_sha256 is None:
        raise AuthenticationError(
            "The admin API is off: set tenancy.admin_key_sha256 to turn it on."
        )
    if not matches(required_key(headers), admin_key_sha256):
        raise AuthenticationError("Incorrect admin API key provided.")


def carries_admin_key(headers: Mapping[str, str], admin_key_sha256: str | None) -> bool:
    """Whether the request carries the admin key."""
    try:
        key = presented_key(headers)
    except MalformedKey:
        return False
    return key is not None and matches(key, admin_key_sha256)
