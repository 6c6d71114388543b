"""Beam search on the tiny model through the gateway with the demo's sampling defaults on every
served model (the shared sidecar): the choices are transformers' beams of the model itself, best
first, through our ensemble and BLS, decoupled and not, and the ``tensorrt_llm`` entry, whose
choices carry each beam's own log probs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import openai
import pytest

from deploy.sidecar.supervisor import Sidecar
from tests.support.beam_cases import Case, Reference, check_log_probs, references, search
from tests.support.gateway import (
    BLS_MODEL,
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    SYNC_ENSEMBLE_MODEL,
    TINY_MODELS,
    LiveGateway,
    sidecar_settings,
)

pytestmark = pytest.mark.slow

CASES = [
    Case("story", "Once upon a time", 3, 10),
    Case("fox", "The quick brown fox", 2, 8, min_tokens=8),
    Case("code", "def add(a, b):", 4, 8, length_penalty=1.0),
    Case("letters", "a b c d e f g h i j k l m n", 4, 6, min_tokens=3, length_penalty=2.0),
]
ENTRIES = (ENSEMBLE_MODEL, BLS_MODEL, SYNC_ENSEMBLE_MODEL, ENGINE_MODEL)


@pytest.fixture(scope="module")
def expected(tiny_model_dir: Path) -> dict[str, Reference]:
    return references(tiny_model_dir, CASES)


@pytest.fixture(scope="module")
def client(sidecar: Sidecar, tiny_model_dir: Path) -> Iterator[openai.OpenAI]:
    """A gateway over the shared sidecar's tiny pipelines, each with the demo's defaults."""
    from gateway.cli import demo_settings

    defaults = demo_settings("127.0.0.1", 0).models[0].defaults
    models = {name: TINY_MODELS[name] for name in ENTRIES}
    settings = sidecar_settings(sidecar, tiny_model_dir, models=models)
    settings = msgspec.structs.replace(
        settings,
        models=tuple(msgspec.structs.replace(m, defaults=defaults) for m in settings.models),
    )
    gateway = LiveGateway(settings).start()
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as c:
        yield c
    gateway.stop()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
@pytest.mark.parametrize("entry", ENTRIES)
def test_choices_are_transformers_beams_best_first(
    client: openai.OpenAI, expected: dict[str, Reference], entry: str, case: Case
) -> None:
    reply = search(client, entry, case)
    assert [choice.text for choice in reply.choices] == expected[case.name].texts


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_beams_log_probs_are_the_models_own(
    client: openai.OpenAI, expected: dict[str, Reference], case: Case
) -> None:
    check_log_probs(search(client, ENGINE_MODEL, case, logprobs=0), case, expected[case.name])
