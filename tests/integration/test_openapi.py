"""The OpenAPI document: served, complete, what the openai SDK sends, and fuzzed with it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import jsonschema_rs
import msgspec
import openai
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from litestar.routes import ASGIRoute
from litestar.testing import TestClient
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
)

from deploy.sidecar.supervisor import Sidecar
from gateway.app import create_app
from gateway.app.openapi import document
from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import KeyEntry, TenancySettings, TenantPolicy
from gateway.tenancy.service import digest, new_key
from tests.support.gateway import ENSEMBLE_MODEL, LiveGateway, gateway_url  # noqa: F401

DOCUMENT = document("0")


def _validator(name: str) -> Any:
    return jsonschema_rs.validator_for(
        {"$ref": f"#/components/schemas/{name}", "components": DOCUMENT["components"]}
    )


def _methods(route: Any) -> set[str]:
    """The methods a route answers: an ASGI route's are declared by its handler."""
    if isinstance(route, ASGIRoute):
        return set(route.route_handler.opt.get("methods", ()))
    return set(route.methods)


def test_every_route_is_documented_and_nothing_else(tiny_model_dir: Path) -> None:
    settings = Settings(
        models=(
            ModelSettings(name="m", triton_url="127.0.0.1:1", tokenizer_dir=str(tiny_model_dir)),
        ),
        tenancy=TenancySettings(auth=False),
    )
    app = create_app(settings)
    routes = {
        (method.lower(), re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path))
        for route in app.routes
        for method in _methods(route)
        if method not in ("HEAD", "OPTIONS") and not route.path.startswith(("/openapi", "/docs"))
    }
    documented = {(m, path) for path, item in DOCUMENT["paths"].items() for m in item}
    assert routes == documented
    with TestClient(app) as client:
        public = document("0", admin=False)
        served = client.get("/openapi.json").json()
        assert served["paths"] == json.loads(json.dumps(public["paths"]))
        assert served["components"] == json.loads(json.dumps(public["components"]))
        assert "openapi.json" in client.get("/docs").text


def test_only_the_admin_key_reads_about_the_admin_api(tiny_model_dir: Path) -> None:
    admin_key, tenant_key = new_key(), new_key()
    settings = Settings(
        models=(
            ModelSettings(name="m", triton_url="127.0.0.1:1", tokenizer_dir=str(tiny_model_dir)),
        ),
        tenancy=TenancySettings(
            tenants=(TenantPolicy(name="a"),),
            keys=(KeyEntry(tenant="a", sha256=digest(tenant_key)),),
            admin_key_sha256=digest(admin_key),
        ),
    )
    admin_routes = {"/admin/tenants", "/admin/keys", "/v1/load_lora_adapter"}
    with TestClient(create_app(settings)) as client:
        for headers in ({}, {"Authorization": f"Bearer {tenant_key}"}):
            public = client.get("/openapi.json", headers=headers).json()
            assert not admin_routes & set(public["paths"])
            assert not [path for path in public["paths"] if path.startswith("/admin")]
            assert "admin" not in public["components"]["securitySchemes"]
            assert "TenantPolicy" not in public["components"]["schemas"]
            assert "/v1/chat/completions" in public["paths"]
        full = client.get("/openapi.json", headers={"Authorization": f"Bearer {admin_key}"})
        assert full.json()["paths"] == json.loads(json.dumps(DOCUMENT["paths"]))


@pytest.mark.parametrize("page_path", ["/docs", "/docs/"])
def test_the_docs_page_loads_nothing_from_elsewhere(tiny_model_dir: Path, page_path: str) -> None:
    """Hosts without network get a working page: every file it loads is served here."""
    settings = Settings(
        models=(
            ModelSettings(name="m", triton_url="127.0.0.1:1", tokenizer_dir=str(tiny_model_dir)),
        ),
        tenancy=TenancySettings(auth=False),
    )
    with TestClient(create_app(settings)) as client:
        page = client.get(page_path)
        assert page.status_code == 200
        references = re.findall(r'(?:src|href|url)\s*[=:]\s*"([^"]+)"', page.text)
        assert len(references) >= 4
        assert not [ref for ref in references if re.match(r"^(?:[a-z]+:)?//", ref)]
        for ref in references:
            # Resolved as the browser does, against the page's own address.
            served = client.get(urljoin(f"http://testserver{page_path}", ref))
            assert served.status_code == 200, ref
            assert served.content
        assert "SwaggerUIBundle" in client.get("/docs/assets/swagger-ui-bundle.js").text
        assert client.get("/docs/assets/nope.js").status_code == 404


@pytest.mark.parametrize(
    ("name", "body", "valid"),
    [
        (
            "ChatCompletionRequest",
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            True,
        ),
        (
            "ChatCompletionRequest",
            {"model": "m", "messages": [{"role": "robot", "content": "x"}]},
            False,
        ),
        ("ChatCompletionRequest", {"model": "m", "messages": [], "n": 0}, False),
        ("CompletionRequest", {"model": "m", "prompt": [[1, 2], [3]]}, True),
        ("CompletionRequest", {"model": "m", "prompt": 5}, False),
    ],
)
def test_the_schemas_agree_with_the_decoder(name: str, body: dict[str, Any], valid: bool) -> None:
    from gateway.openai import protocol

    assert _validator(name).is_valid(body) is valid
    try:
        msgspec.convert(body, getattr(protocol, name))
        decoded = True
    except msgspec.ValidationError:
        decoded = False
    assert decoded is valid


@pytest.mark.slow
def test_the_openai_sdks_requests_validate(gateway_url: str) -> None:  # noqa: F811
    sent: list[tuple[str, dict[str, Any]]] = []

    def record(request: httpx.Request) -> None:
        sent.append((request.url.path, json.loads(request.content)))

    http = httpx.Client(event_hooks={"request": [record]})
    client = openai.OpenAI(
        base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0, http_client=http
    )
    messages: Any = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]
    tools: Any = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    chat = client.chat.completions.create(
        model=ENSEMBLE_MODEL,
        messages=messages,
        max_tokens=4,
        temperature=0.5,
        top_p=0.9,
        seed=3,
        stop=["\n\n"],
        n=2,
        logprobs=True,
        top_logprobs=0,
        presence_penalty=0.1,
        frequency_penalty=0.1,
        user="u",
        tools=tools,
        tool_choice="auto",
        parallel_tool_calls=False,
    )
    list(
        client.chat.completions.create(
            model=ENSEMBLE_MODEL,
            messages=messages[:2],
            max_completion_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
            response_format={"type": "json_object"},
        )
    )
    completion = client.completions.create(
        model=ENSEMBLE_MODEL, prompt=["a", "b"], max_tokens=3, echo=True, logprobs=0, seed=1
    )
    client.completions.create(model=ENSEMBLE_MODEL, prompt=[1, 2, 3], max_tokens=2)
    assert len(sent) == 4
    for path, body in sent:
        name = "ChatCompletionRequest" if path.endswith("chat/completions") else "CompletionRequest"
        errors = [str(error) for error in _validator(name).iter_errors(body)]
        assert not errors, (path, errors)
    assert _validator("ChatCompletion").is_valid(chat.model_dump(exclude_unset=True))
    assert _validator("Completion").is_valid(completion.model_dump(exclude_unset=True))


@pytest.fixture(scope="module")
def fuzz_target(sidecar: Sidecar, tiny_model_dir: Path) -> Iterator[str]:
    """A gateway on the test sidecar with a short context, so accepted requests stay cheap."""
    model = ModelSettings(
        name=ENSEMBLE_MODEL,
        triton_url=sidecar.grpc_url,
        triton_model="tiny_ensemble",
        tokenizer_dir=str(tiny_model_dir),
        context_length=96,
        max_n=2,
    )
    limits = LimitSettings(max_body_bytes=64 * 1024, request_timeout_s=30)
    gateway = LiveGateway(
        Settings(models=(model,), limits=limits, tenancy=TenancySettings(auth=False))
    ).start()
    yield gateway.url
    gateway.stop()


SCHEMA = schemathesis.openapi.from_dict(DOCUMENT).include(
    path_regex=r"^/v1/(chat/completions|completions|responses.*|models.*)$"
)


@pytest.mark.slow
@SCHEMA.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_fuzzed_requests_get_answers_or_openai_errors(case: Any, fuzz_target: str) -> None:
    if isinstance(case.body, dict) and case.operation.path.endswith(("completions", "responses")):
        case.body["model"] = ENSEMBLE_MODEL  # reach the model, not only the 404
        case.body["stream"] = False
    response = case.call(base_url=fuzz_target, timeout=60)
    case.validate_response(
        response,
        checks=[not_a_server_error, content_type_conformance, response_schema_conformance],
    )
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
