"""Beam search on SmolLM2, the demo's model, through the gateway with the demo's sampling
defaults on every served model: the choices are transformers' beams of the model itself, best
first, through our ensemble, BLS and ``tensorrt_llm`` entry and through v0.19's stock ensemble
and BLS; through the engine entry each beam's log probs are the model's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.support.beam_cases import Case, Reference, check_log_probs, references, search
from tests.support.gateway import LiveGateway
from tests.support.sidecars import MAX_BEAM_WIDTH, QUICK_STOP
from tests.support.stock import STOCK_MODELS, start_stock_sidecar
from tests.support.stock_stack import TOKENS_PER_BLOCK

pytestmark = [pytest.mark.slow, pytest.mark.smollm]

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
INVENTIONS = "The three most important inventions of the nineteenth century were"


CASES = [
    # The report of issue 53: every beam runs to max_tokens, so a length penalty reorders none.
    Case("report", INVENTIONS, 3, 8, min_tokens=8),
    Case("report-penalised", INVENTIONS, 3, 8, min_tokens=8, length_penalty=1.0),
    # Beams that end on the end token at different lengths, ranked by the length penalty.
    Case("ending", CHAT.format("Answer with one word: is water wet?"), 4, 8, length_penalty=1.0),
    Case("fruit", "My favourite fruit is", 2, 6),
]
ENTRIES = {
    "ensemble": "smol_ensemble",
    "bls": "smol_tensorrt_llm_bls",
    "engine": "smol_tensorrt_llm",
    "stock-ensemble": "ensemble",
    "stock-bls": "tensorrt_llm_bls",
}
"""The gateway's models: name, then the Triton model (``stock-`` ones in v0.19's stock stack)."""


@pytest.fixture(scope="module")
def smol_dir() -> Path:
    from deploy.sidecar.models import ensure_smollm2

    try:
        return ensure_smollm2()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def expected(smol_dir: Path) -> dict[str, Reference]:
    return references(smol_dir, CASES)


@pytest.fixture(scope="module")
def client(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    """A gateway over SmolLM2 in our pipeline and in v0.19's stock models, every model with
    the demo's sampling defaults (a low temperature and a repetition penalty)."""
    from deploy.sidecar.fleet import sidecar_from_spec
    from deploy.sidecar.spec import parse_spec
    from gateway.cli import demo_settings

    defaults = demo_settings("127.0.0.1", 0).models[0].defaults
    engine = {
        "kind": "torch",
        "model_dir": str(smol_dir),
        "max_batch_size": 4,
        "max_beam_width": MAX_BEAM_WIDTH,
    }
    spec = parse_spec(
        {
            "models": [{"name": "smol", "release": "latest", "engine": engine}],
            "sidecars": [{"name": "smolbeams", **QUICK_STOP}],
        }
    )
    ours = sidecar_from_spec(spec, spec.sidecars[0], tmp_path_factory.mktemp("smol-beams"))
    ours.start()
    stock: Sidecar | None = None
    gateway: LiveGateway | None = None
    try:
        if STOCK_MODELS.is_dir():
            stock = start_stock_sidecar("v0.19", True, smol_dir, tmp_path_factory.mktemp("stock"))

        def model(name: str, triton_model: str) -> ModelSettings:
            sidecar = stock if name.startswith("stock-") else ours
            assert sidecar is not None
            entry = {"bls": "tensorrt_llm_bls", "engine": "tensorrt_llm"}.get(
                name.removeprefix("stock-"), "ensemble"
            )
            return ModelSettings(
                name=name,
                triton_url=sidecar.grpc_url,
                triton_model=triton_model,
                entry=entry,  # type: ignore[arg-type]
                tokenizer_dir=str(smol_dir),
                defaults=defaults,
                tokens_per_block=TOKENS_PER_BLOCK if sidecar is stock else None,
            )

        settings = Settings(
            models=tuple(
                model(name, triton)
                for name, triton in ENTRIES.items()
                if stock is not None or not name.startswith("stock-")
            ),
            limits=LimitSettings(request_timeout_s=120.0, shutdown_grace_s=5.0),
            tenancy=TenancySettings(auth=False),
        )
        gateway = LiveGateway(settings).start()
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as c:
            yield c
    finally:
        if gateway is not None:
            gateway.stop()
        if stock is not None:
            stock.stop()
        ours.stop()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_choices_are_transformers_beams_best_first(
    client: openai.OpenAI, expected: dict[str, Reference], entry: str, case: Case
) -> None:
    if entry.startswith("stock-") and not STOCK_MODELS.is_dir():
        pytest.skip(f"the stock models are not beside the checkout ({STOCK_MODELS})")
    reply = search(client, entry, case)
    assert [choice.text for choice in reply.choices] == expected[case.name].texts


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_beams_log_probs_are_the_models_own(
    client: openai.OpenAI, expected: dict[str, Reference], case: Case
) -> None:
    """Through the engine entry every choice carries its beam's log probs."""
    check_log_probs(search(client, "engine", case, logprobs=0), case, expected[case.name])
