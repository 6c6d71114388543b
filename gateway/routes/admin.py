"""``/admin``: tenants and API keys at run time, behind the admin key (never a tenant key).

Changes go to the Redis store and reach every replica within its refresh period; with the
memory store the configuration file is the only source, and writes answer 409.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from litestar import Request, delete, get, post, put
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from gateway.errors import ConflictError, InvalidRequestError, ResourceNotFoundError
from gateway.tenancy import KeyEntry, TenantPolicy
from gateway.tenancy.config import TenancyConfigError
from gateway.tenancy.directory import DirectoryReadOnly
from gateway.tenancy.keys import digest, new_key
from gateway.tenancy.service import Tenancy
from gateway.transport import decode_body


class KeyRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Body of ``POST /admin/keys``."""

    tenant: str
    name: str = ""


class KeyView(msgspec.Struct, frozen=True, kw_only=True):
    """A key as the admin API shows it: never the key, its id and owner only."""

    key_id: str
    tenant: str
    name: str


class NewKey(KeyView, frozen=True, kw_only=True):
    """A key just made: the only time the key itself is shown."""

    key: str
    sha256: str


class Listing(msgspec.Struct, frozen=True, kw_only=True):
    """A list of admin resources."""

    object: str = "list"
    data: list[Any]


@asynccontextmanager
async def _writing() -> AsyncIterator[None]:
    try:
        yield
    except DirectoryReadOnly as exc:
        raise ConflictError(str(exc), code="store_read_only") from None
    except TenancyConfigError as exc:
        raise InvalidRequestError(str(exc)) from None


def _view(entry: KeyEntry) -> KeyView:
    return KeyView(key_id=entry.key_id, tenant=entry.tenant, name=entry.name)


@get("/admin/tenants")
async def list_tenants(administrator: None, tenancy: Tenancy) -> Listing:
    """Every tenant and its policy."""
    return Listing(data=tenancy.directory.tenants())


@put("/admin/tenants/{name:str}")
async def put_tenant(
    name: str, request: Request[Any, Any, Any], administrator: None, tenancy: Tenancy
) -> TenantPolicy:
    """Create or replace a tenant's policy (the body is a policy; its name is the path's)."""
    fields = decode_body(await request.body(), dict[str, Any])
    try:
        policy = msgspec.convert({**fields, "name": name}, TenantPolicy)
    except msgspec.DecodeError as exc:
        raise InvalidRequestError(f"Invalid tenant policy: {exc}") from None
    async with _writing():
        await tenancy.directory.put_tenant(policy)
    return policy


@delete("/admin/tenants/{name:str}", status_code=HTTP_204_NO_CONTENT)
async def delete_tenant(name: str, administrator: None, tenancy: Tenancy) -> None:
    """Remove a tenant; its keys stop working."""
    async with _writing():
        if not await tenancy.directory.delete_tenant(name):
            raise ResourceNotFoundError(f"No tenant called {name!r}.", param="name")


@get("/admin/keys")
async def list_keys(administrator: None, tenancy: Tenancy) -> Listing:
    """Every working key: its id, tenant and name (keys themselves are never stored)."""
    return Listing(data=[_view(entry) for entry in tenancy.directory.key_entries()])


@post("/admin/keys", status_code=HTTP_201_CREATED)
async def create_key(
    request: Request[Any, Any, Any], administrator: None, tenancy: Tenancy
) -> NewKey:
    """Make a key for a tenant; the answer is the only place the key is ever shown."""
    body = decode_body(await request.body(), KeyRequest)
    if tenancy.directory.tenant(body.tenant) is None:
        raise ResourceNotFoundError(f"No tenant called {body.tenant!r}.", param="tenant")
    key = new_key()
    entry = KeyEntry(tenant=body.tenant, sha256=digest(key), name=body.name)
    async with _writing():
        await tenancy.directory.add_key(entry)
    return NewKey(key=key, sha256=entry.sha256, **msgspec.structs.asdict(_view(entry)))


@delete("/admin/keys/{key_id:str}", status_code=HTTP_204_NO_CONTENT)
async def revoke_key(key_id: str, administrator: None, tenancy: Tenancy) -> None:
    """Revoke a key on every replica."""
    async with _writing():
        if await tenancy.directory.revoke(key_id) is None:
            raise ResourceNotFoundError(f"No key with id {key_id!r}.", param="key_id")


ROUTES = [list_tenants, put_tenant, delete_tenant, list_keys, create_key, revoke_key]
