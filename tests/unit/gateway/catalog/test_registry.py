"""A served model as loaded: what depends on the model alone is decided once, when it loads."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.catalog.registry import ModelRegistry, load_model
from gateway.core.plan import Prompt
from gateway.errors import ModelNotFoundError
from gateway.tenancy import TenantPolicy
from tests.support.tiny_routes import tiny_route

HARMONY = "<|start|>{{ messages[0].content }}<|channel|>analysis<|message|>"
THINK_AND_CALLS = "<think></think>{{ messages[0].content }}<tool_call>"


@pytest.fixture(scope="module")
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as pool:
        yield pool


@pytest.mark.parametrize(
    ("tool_call_format", "reasoning_parser", "template", "formats"),
    [
        (None, None, None, ("hermes", None)),
        ("mistral", "think", None, ("mistral", "think")),
        (None, None, HARMONY, ("harmony", "harmony")),
        (None, None, THINK_AND_CALLS, ("hermes", "think")),
        ("pythonic", "none", THINK_AND_CALLS, ("pythonic", None)),
    ],
)
def test_a_model_s_formats_are_decided_when_it_loads(
    tiny_model_dir: Path,
    executor: ThreadPoolExecutor,
    tmp_path: Path,
    tool_call_format: str | None,
    reasoning_parser: str | None,
    template: str | None,
    formats: tuple[str, str | None],
) -> None:
    """The settings' tool-call and reasoning formats, else those the chat template shows (the
    tiny model's ChatML shows none: Hermes calls, no reasoning), are the served model's own."""
    template_file = None
    if template is not None:
        template_file = tmp_path / "chat.jinja"
        template_file.write_text(template)
    route = tiny_route(
        tiny_model_dir,
        chat_template_file=None if template_file is None else str(template_file),
        tool_call_format=tool_call_format,
        reasoning_parser=reasoning_parser,
    )
    served = load_model(route, executor)
    reasoning = served.reasoning.name if served.reasoning is not None else None
    assert (served.tool_format.name, reasoning) == formats


@pytest.mark.parametrize("counts_prompts", [True, False])
def test_what_every_request_reads_of_a_model_is_decided_when_it_loads(
    tiny_model_dir: Path, executor: ThreadPoolExecutor, counts_prompts: bool
) -> None:
    route = tiny_route(tiny_model_dir, counts_prompts=counts_prompts)
    served = load_model(route, executor)
    assert (served.name, served.target, served.own_counts) == ("tiny", route.target, counts_prompts)
    prompt = Prompt(text="hi", token_count=3, ids=(1, 2, 3))
    assert served.own_count(prompt) == (prompt.exact_count if counts_prompts else None)


@pytest.mark.parametrize(
    ("models", "found"),
    [(("*",), True), (("tiny",), True), (("ti*",), True), (("t?ny", "other"), True),
     (("other",), False), ((), False)],
)  # fmt: skip
def test_a_model_is_found_for_the_tenants_that_may_use_it(
    tiny_model_dir: Path, executor: ThreadPoolExecutor, models: tuple[str, ...], found: bool
) -> None:
    registry = ModelRegistry(
        [load_model(tiny_route(tiny_model_dir, counts_prompts=False), executor)]
    )
    tenant = TenantPolicy(name="t", models=models)
    if found:
        assert registry.get("tiny", tenant).name == "tiny"
        return
    with pytest.raises(ModelNotFoundError) as caught:
        registry.get("tiny", tenant)
    assert caught.value.code == "model_not_found"
