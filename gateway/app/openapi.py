"""The OpenAPI document, built from the same msgspec types that decode the requests.

Request and response schemas come from ``msgspec.json.schema_components`` of the structs the
routes decode and encode, so the document accepts exactly what the API accepts. Every error is
OpenAI's ``{"error": {...}}`` object (the ``default`` response).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.errors import ErrorEnvelope
from gateway.openai.models.lora import LoadAdapter, UnloadAdapter
from gateway.openai.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from gateway.openai.responses.protocol import (
    DeletedResponse,
    InputItemList,
    ResponseObject,
    ResponsesRequest,
)
from gateway.tenancy import TenantPolicy
from gateway.tenancy.edits import TenantFields
from gateway.tenancy.routes import KeyRequest, Listing

REF = "#/components/schemas/{name}"
SSE = "text/event-stream"
PROMETHEUS = "text/plain; version=0.0.4"


@dataclass(frozen=True)
class Operation:
    """One route as documented."""

    method: str
    path: str
    summary: str
    tag: str
    body: type | None = None
    answer: type | None = None
    stream: type | None = None
    """The type of each ``data:`` event when the request asks for ``stream: true``."""
    status: int = 200
    media_type: str = "application/json"
    security: str | None = "api_key"
    parameters: tuple[str, ...] = field(default=())


OPERATIONS = (
    Operation("post", "/v1/chat/completions", "Answer a conversation", "OpenAI",
              ChatCompletionRequest, ChatCompletion, ChatCompletionChunk),
    Operation("post", "/v1/completions", "Complete prompts", "OpenAI",
              CompletionRequest, Completion, Completion),
    Operation("post", "/v1/responses", "Create a response (events when streamed: see the "
              "Responses API page)", "OpenAI", ResponsesRequest, ResponseObject),
    Operation("get", "/v1/responses/{response_id}", "A stored response of the caller",
              "OpenAI", answer=ResponseObject, parameters=("response_id",)),
    Operation("delete", "/v1/responses/{response_id}", "Forget a stored response", "OpenAI",
              answer=DeletedResponse, parameters=("response_id",)),
    Operation("get", "/v1/responses/{response_id}/input_items", "The input items of a stored "
              "response", "OpenAI", answer=InputItemList, parameters=("response_id",)),
    Operation("get", "/v1/models", "List the models the caller may use", "OpenAI",
              answer=ModelList),
    Operation("get", "/v1/models/{model_id}", "Describe one model", "OpenAI",
              answer=ModelCard, parameters=("model_id",)),
    Operation("post", "/v1/load_lora_adapter", "Load a LoRA adapter; answers its model card",
              "Admin", LoadAdapter, ModelCard, security="admin"),
    Operation("post", "/v1/unload_lora_adapter", "Unload a LoRA adapter", "Admin",
              UnloadAdapter, security="admin", media_type="text/plain"),
    Operation("get", "/admin/tenants", "List tenants", "Admin", answer=Listing, security="admin"),
    Operation("put", "/admin/tenants/{name}", "Create a tenant or replace its whole policy "
              "(every field required)", "Admin", TenantFields, TenantPolicy, security="admin",
              parameters=("name",)),
    Operation("patch", "/admin/tenants/{name}", "Change some fields of a tenant's policy "
              "(null lifts a limit)", "Admin", TenantFields, TenantPolicy, security="admin",
              parameters=("name",)),
    Operation("delete", "/admin/tenants/{name}", "Remove a tenant", "Admin", status=204,
              security="admin", parameters=("name",)),
    Operation("get", "/admin/tenants/{name}/responses", "List the ids of a tenant's stored "
              "responses", "Admin", answer=Listing, security="admin", parameters=("name",)),
    Operation("get", "/admin/keys", "List API keys", "Admin", answer=Listing, security="admin"),
    Operation("post", "/admin/keys", "Create an API key", "Admin", KeyRequest, status=201,
              security="admin"),
    Operation("delete", "/admin/keys/{key_id}", "Revoke an API key", "Admin", status=204,
              security="admin", parameters=("key_id",)),
    Operation("get", "/health/live", "Liveness", "Operations", security=None),
    Operation("get", "/health/ready", "Readiness of every model", "Operations", security=None),
    Operation("get", "/metrics", "Prometheus metrics", "Operations", media_type=PROMETHEUS,
              security=None),
    Operation("get", "/metrics/sidecars/{name}", "A sidecar's Triton metrics", "Operations",
              media_type=PROMETHEUS, security=None, parameters=("name",)),
)  # fmt: skip


def _types(operations: list[Operation]) -> list[Any]:
    found: list[Any] = [ErrorEnvelope]
    for operation in operations:
        found += [t for t in (operation.body, operation.answer, operation.stream) if t is not None]
    return list(dict.fromkeys(found))


def _ref(kind: type) -> dict[str, str]:
    return {"$ref": REF.format(name=kind.__name__)}


def _responses(operation: Operation) -> dict[str, Any]:
    success: dict[str, Any] = {"description": "Success"}
    if operation.answer is not None:
        success["content"] = {operation.media_type: {"schema": _ref(operation.answer)}}
        if operation.stream is not None:
            success["content"][SSE] = {
                "schema": {"type": "string"},
                "x-event-schema": _ref(operation.stream),
            }
    elif operation.status != 204:
        success["content"] = {operation.media_type: {"schema": {}}}
    return {
        str(operation.status): success,
        "default": {
            "description": "An error in OpenAI's format",
            "content": {"application/json": {"schema": _ref(ErrorEnvelope)}},
        },
    }


def _operation(operation: Operation) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "summary": operation.summary,
        "tags": [operation.tag],
        "operationId": f"{operation.method}_{operation.path}".replace("/", "_").strip("_"),
        "responses": _responses(operation),
    }
    if operation.parameters:
        entry["parameters"] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in operation.parameters
        ]
    if operation.body is not None:
        entry["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(operation.body)}},
        }
    if operation.security is not None:
        entry["security"] = [{operation.security: []}]
    return entry


def document(version: str, *, admin: bool = True) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the gateway; ``admin=False`` leaves out the admin API (its
    routes and their schemas), which only the admin key may read about."""
    operations = [op for op in OPERATIONS if admin or op.security != "admin"]
    _, components = msgspec.json.schema_components(_types(operations), ref_template=REF)
    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        paths.setdefault(operation.path, {})[operation.method] = _operation(operation)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "triton-gateway",
            "version": version,
            "description": "OpenAI-compatible API over Triton Inference Server running "
            "TensorRT-LLM.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "api_key": {"type": "http", "scheme": "bearer"},
                **({"admin": {"type": "http", "scheme": "bearer"}} if admin else {}),
            },
        },
    }


DOCS_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>triton-gateway API</title>
<link rel="stylesheet" href="{assets}swagger-ui.css">
<link rel="icon" type="image/png" href="{assets}favicon-32x32.png"></head>
<body><div id="swagger-ui"></div>
<script src="{assets}swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({{url: "{document}", dom_id: "#swagger-ui", validatorUrl: null}});</script>
<noscript>The API description is at <a href="{document}">openapi.json</a>.</noscript>
</body></html>
"""


def docs_page(path: str) -> str:
    """The page as served at ``path`` (``/docs`` or ``/docs/``). Its links stay relative, so it
    works behind a proxy that serves the gateway under a prefix; relative to ``/docs/`` they
    start one level lower."""
    if path.endswith("/"):
        return DOCS_PAGE.format(assets="assets/", document="../openapi.json")
    return DOCS_PAGE.format(assets="docs/assets/", document="openapi.json")
