"""Beam search on SmolLM2, the demo's model, through the gateway with the demo's sampling
defaults on every served model: the choices are transformers' beams of the model itself, best
first, through our ensemble, BLS and ``tensorrt_llm`` entry and through v0.19's stock ensemble
and BLS; through the engine entry each beam's log probs are the model's own."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from deploy.sidecar.supervisor import Sidecar
from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.support.engine import ReferenceBeam, beam_search_reference, own_log_prob
from tests.support.gateway import LiveGateway
from tests.support.sidecars import MAX_BEAM_WIDTH, QUICK_STOP
from tests.support.stock import STOCK_MODELS, start_stock_sidecar
from tests.support.stock_stack import TOKENS_PER_BLOCK

pytestmark = [pytest.mark.slow, pytest.mark.smollm]

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
INVENTIONS = "The three most important inventions of the nineteenth century were"


@dataclass(frozen=True)
class Case:
    """One beam search: the prompt, the width (``n``), ``max_tokens``, and the optional
    ``min_tokens`` and ``length_penalty`` the request sends."""

    name: str
    prompt: str
    width: int
    max_tokens: int
    min_tokens: int | None = None
    length_penalty: float | None = None

    def body(self) -> dict[str, Any]:
        extra = {"min_tokens": self.min_tokens, "length_penalty": self.length_penalty}
        return {"use_beam_search": True, **{k: v for k, v in extra.items() if v is not None}}


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


@dataclass(frozen=True)
class Reference:
    """transformers' beams of a case, their texts as the pipelines decode them, and the
    model's own score of each beam (the raw logits' log-softmax summed over its tokens)."""

    beams: list[ReferenceBeam]
    texts: list[str]
    own: list[float]


@pytest.fixture(scope="module")
def references(smol_dir: Path) -> dict[str, Reference]:
    """Every case's reference, on the same folder in float32, with one torch thread (beside
    tritonservers on a few cores more threads only wait on each other)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_dir)
    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    found: dict[str, Reference] = {}
    try:
        for case in CASES:
            prompt = tuple(tokenizer.encode(case.prompt))
            # The engine bans the end token from the first token on (TensorRT-LLM's
            # min_tokens default of 1), so transformers is asked for at least one token too.
            beams = beam_search_reference(
                model, prompt, case.width, case.max_tokens,
                min_new=max(1, case.min_tokens or 0), length_penalty=case.length_penalty or 0.0,
            )  # fmt: skip
            found[case.name] = Reference(
                beams,
                [tokenizer.decode(beam.tokens, skip_special_tokens=True) for beam in beams],
                [own_log_prob(model, prompt, beam.tokens) for beam in beams],
            )
    finally:
        torch.set_num_threads(threads)
    return found


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


def _beams(client: openai.OpenAI, model: str, case: Case, **extra: Any) -> Any:
    return client.completions.create(
        model=model,
        prompt=case.prompt,
        n=case.width,
        max_tokens=case.max_tokens,
        extra_body=case.body(),
        **extra,
    )


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_choices_are_transformers_beams_best_first(
    client: openai.OpenAI, references: dict[str, Reference], entry: str, case: Case
) -> None:
    if entry.startswith("stock-") and not STOCK_MODELS.is_dir():
        pytest.skip(f"the stock models are not beside the checkout ({STOCK_MODELS})")
    reply = _beams(client, entry, case)
    assert [choice.text for choice in reply.choices] == references[case.name].texts


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_beams_log_probs_are_the_models_own(
    client: openai.OpenAI, references: dict[str, Reference], case: Case
) -> None:
    """Through the engine entry every choice carries its beam's log probs: summed, transformers'
    score of the beam (end token left out) and, where ``min_tokens`` bans no end token beyond
    the first, the model's own score of its tokens, within 1e-3."""
    reply = _beams(client, "engine", case, logprobs=0)
    reference = references[case.name]
    for choice, beam, own in zip(reply.choices, reference.beams, reference.own, strict=True):
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        assert choice.logprobs.token_logprobs == pytest.approx(beam.log_probs, abs=1e-3)
        total = sum(choice.logprobs.token_logprobs)
        assert total == pytest.approx(sum(beam.log_probs), abs=1e-3)
        if case.min_tokens is None or case.min_tokens <= 1:
            assert total == pytest.approx(own, abs=1e-3)
