"""``/admin``: tenants and API keys at run time, and ``admin_only``, the guard of the admin
router (these routes and the LoRA endpoints): the admin key passes, a tenant key never does.

Changes go to the Redis store and reach every replica within its refresh period; with the
memory store the configuration file is the only source, and writes answer 409. How run-time
changes and the settings file combine is ``gateway.tenancy.state``'s rule.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from litestar import Request, delete, get, patch, post, put
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from gateway.errors import ConflictError, InvalidRequestError, ResourceNotFoundError
from gateway.http.answers import decode_body
from gateway.tenancy import KeyEntry, TenantPolicy
from gateway.tenancy.config import PolicyError, TenancyConfigError, check_key
from gateway.tenancy.directory import DirectoryReadOnly
from gateway.tenancy.edits import TenantFields, apply_fields, missing_fields
from gateway.tenancy.service import Tenancy, digest, new_key


class KeyRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Body of ``POST /admin/keys``."""

    tenant: str
    name: str = ""
    """What the key is for: up to 128 printable ASCII characters."""


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
    except PolicyError as exc:
        raise InvalidRequestError(str(exc), param=exc.field) from None
    except TenancyConfigError as exc:
        raise InvalidRequestError(str(exc)) from None


def admin_only(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """The guard of the admin router: only the admin key passes (never a tenant's key)."""
    tenancy: Tenancy = connection.app.state.runtime.tenancy
    tenancy.authenticate_admin(connection.headers)


def _view(entry: KeyEntry) -> KeyView:
    return KeyView(key_id=entry.key_id, tenant=entry.tenant, name=entry.name)


@get("/admin/tenants")
async def list_tenants(tenancy: Tenancy) -> Listing:
    """Every tenant and its policy."""
    return Listing(data=tenancy.directory.tenants())


@put("/admin/tenants/{name:str}")
async def put_tenant(name: str, request: Request[Any, Any, Any], tenancy: Tenancy) -> TenantPolicy:
    """Create a tenant or replace its whole policy: the body must give every field."""
    fields = decode_body(await request.body(), TenantFields)
    missing = missing_fields(fields)
    if missing:
        raise InvalidRequestError(
            f"PUT replaces the whole policy, and the body leaves out {', '.join(missing)}. "
            f"Send every field, or PATCH /admin/tenants/{name} to change only some.",
            param=missing[0],
        )
    async with _writing():
        policy = apply_fields(TenantPolicy(name=name), fields)
        await tenancy.directory.put_tenant(policy)
    return policy


@patch("/admin/tenants/{name:str}")
async def patch_tenant(
    name: str, request: Request[Any, Any, Any], tenancy: Tenancy
) -> TenantPolicy:
    """Change the fields the body gives and keep the others; ``null`` lifts a limit."""
    fields = decode_body(await request.body(), TenantFields)
    async with _writing():
        policy = await tenancy.directory.update_tenant(
            name, lambda current: apply_fields(current, fields)
        )
    if policy is None:
        raise ResourceNotFoundError(f"No tenant called {name!r}.", param="name")
    return policy


@delete("/admin/tenants/{name:str}", status_code=HTTP_204_NO_CONTENT)
async def delete_tenant(name: str, tenancy: Tenancy) -> None:
    """Remove a tenant and revoke its keys (they stay revoked if the tenant is created again)."""
    async with _writing():
        if not await tenancy.directory.delete_tenant(name):
            raise ResourceNotFoundError(f"No tenant called {name!r}.", param="name")


@get("/admin/tenants/{name:str}/responses")
async def list_stored_responses(name: str, tenancy: Tenancy) -> Listing:
    """The ids of the responses a tenant keeps stored now, oldest first (their content stays
    the tenant's: only its keys read it)."""
    return Listing(data=await tenancy.responses.ids(name))


@get("/admin/keys")
async def list_keys(tenancy: Tenancy) -> Listing:
    """Every working key: its id, tenant and name (keys themselves are never stored)."""
    return Listing(data=[_view(entry) for entry in tenancy.directory.key_entries()])


@post("/admin/keys", status_code=HTTP_201_CREATED)
async def create_key(request: Request[Any, Any, Any], tenancy: Tenancy) -> NewKey:
    """Make a key for a tenant; the answer is the only place the key is ever shown."""
    body = decode_body(await request.body(), KeyRequest)
    key = new_key()
    entry = KeyEntry(tenant=body.tenant, sha256=digest(key), name=body.name)
    async with _writing():
        check_key(entry)
        if not await tenancy.directory.add_key(entry):
            raise ResourceNotFoundError(f"No tenant called {body.tenant!r}.", param="tenant")
    return NewKey(key=key, sha256=entry.sha256, **msgspec.structs.asdict(_view(entry)))


@delete("/admin/keys/{key_id:str}", status_code=HTTP_204_NO_CONTENT)
async def revoke_key(key_id: str, tenancy: Tenancy) -> None:
    """Revoke a key on every replica."""
    async with _writing():
        if await tenancy.directory.revoke(key_id) is None:
            raise ResourceNotFoundError(f"No key with id {key_id!r}.", param="key_id")


ROUTES = [
    list_tenants,
    put_tenant,
    patch_tenant,
    delete_tenant,
    list_stored_responses,
    list_keys,
    create_key,
    revoke_key,
]
