"""Grammars compile beside the engine, in a real tritonserver: a slow compile holds up no other
request, and one past its deadline is a 400 naming the request field the grammar came from."""

from __future__ import annotations

import itertools
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from tests.support.engine_grpc import Stream, request, tokens_of
from tests.support.gateway import LiveGateway, sidecar_settings
from tests.support.prometheus import scrape_until
from tests.support.schemas import nested_schema, nested_schema_text
from tests.support.sidecars import QUICK_STOP

pytestmark = pytest.mark.slow

PATIENT = "patient_tensorrt_llm"
"""An engine that waits as long as a grammar takes, compiling one at a time."""
HASTY = "hasty"
"""A pipeline whose engine gives a grammar 1 ms: no fresh grammar compiles that fast."""
HASTY_BLS = "hasty-bls"
SLOW_DEPTH = 300
_tags = itertools.count()


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    engine = {"kind": "torch", "model_dir": str(tiny_model_dir), "max_batch_size": 4}
    spec = parse_spec(
        {
            "models": [
                {
                    "name": "patient",
                    "release": "latest",
                    "engine": {
                        **engine,
                        "guided_decoding_compile_timeout_ms": 600_000,
                        "guided_decoding_max_compiles": 1,
                    },
                },
                {
                    "name": HASTY,
                    "release": "latest",
                    "engine": {**engine, "guided_decoding_compile_timeout_ms": 1},
                },
            ],
            "sidecars": [{"name": "grammar", **QUICK_STOP}],
        }
    )
    sidecar = sidecar_from_spec(spec, spec.sidecars[0], tmp_path_factory.mktemp("grammar"))
    sidecar.start()
    yield sidecar
    sidecar.stop()


@pytest.fixture(scope="module")
def client(server: Sidecar, tiny_model_dir: Path) -> Iterator[openai.OpenAI]:
    models = {
        HASTY: (f"{HASTY}_ensemble", "ensemble"),
        HASTY_BLS: (f"{HASTY}_tensorrt_llm_bls", "tensorrt_llm_bls"),
    }
    settings = sidecar_settings(server, tiny_model_dir, models=models)
    gateway = LiveGateway(settings).start()
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as c:
        yield c
    gateway.stop()


def guide_inputs(schema: str) -> dict[str, Any]:
    return {
        "guided_decoding_guide_type": np.array([[b"json_schema"]], dtype=object),
        "guided_decoding_guide": np.array([[schema.encode()]], dtype=object),
    }


def test_requests_decode_while_a_slow_grammar_compiles(server: Sidecar) -> None:
    def scrape() -> str:
        with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
            return str(response.read().decode())

    schema = nested_schema_text(SLOW_DEPTH, f"slow{next(_tags)}")
    guided = Stream(server, request(8, streaming=True, **guide_inputs(schema)), model=PATIENT)
    try:
        # The engine holds it, waiting for its grammar, before the next request is sent.
        labels = {"model": PATIENT, "version": "1", "request_type": "waiting"}
        scrape_until(scrape, "nv_trt_llm_request_metrics", 1.0, timeout_s=60, **labels)
        free = Stream(server, request(8, streaming=True, end_id=-1), model=PATIENT).collect()
        assert len(tokens_of(free)) == 8
        assert guided.received() == [], "the guided request answered before the other finished"
    finally:
        guided.close(cancel=True)


ASK = [{"role": "user", "content": "Fill in the form."}]


@pytest.mark.parametrize("model", [HASTY, HASTY_BLS])
@pytest.mark.parametrize("field", ["response_format", "tools"])
def test_a_grammar_past_its_compile_deadline_is_a_400_naming_its_field(
    client: openai.OpenAI, field: str, model: str
) -> None:
    # Within the gateway's depth bound (two JSON levels an object), past the hasty deadline.
    schema = nested_schema(20, f"late{next(_tags)}")
    if field == "response_format":
        body: dict[str, Any] = {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "form", "schema": schema},
            }
        }
    else:
        function = {"name": "fill", "description": "Fill the form.", "parameters": schema}
        body = {"tools": [{"type": "function", "function": function}], "tool_choice": "required"}
    with pytest.raises(openai.BadRequestError, match="took too long to compile") as caught:
        client.chat.completions.create(
            model=model,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=8,
            extra_body=body,
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == field
    assert "smaller or shallower" in error["message"]
