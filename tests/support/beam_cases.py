"""Beam searches through the gateway checked against transformers: the cases, their references
(transformers' beams, their texts, the model's own scores) and the checks of an answer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from tests.support.engine import ReferenceBeam, beam_search_reference, own_log_prob


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


@dataclass(frozen=True)
class Reference:
    """transformers' beams of a case, their texts as the pipelines decode them, and the
    model's own score of each beam (``own_log_prob``)."""

    beams: list[ReferenceBeam]
    texts: list[str]
    own: list[float]


def references(model_dir: Path, cases: list[Case]) -> dict[str, Reference]:
    """Every case's reference, on ``model_dir`` in float32, with one torch thread (beside
    tritonservers on a few cores more threads only wait on each other)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    found: dict[str, Reference] = {}
    try:
        for case in cases:
            prompt = tuple(tokenizer.encode(case.prompt))
            # The engine bans the end token from the first token on (TensorRT-LLM's
            # min_tokens default of 1), so transformers is asked for at least one token too.
            min_new = max(1, case.min_tokens or 0)
            beams = beam_search_reference(
                model, prompt, case.width, case.max_tokens,
                min_new=min_new, length_penalty=case.length_penalty or 0.0,
            )  # fmt: skip
            found[case.name] = Reference(
                beams,
                [tokenizer.decode(beam.tokens, skip_special_tokens=True) for beam in beams],
                [own_log_prob(model, prompt, b.tokens, min_new=min_new) for b in beams],
            )
    finally:
        torch.set_num_threads(threads)
    return found


def search(client: openai.OpenAI, model: str, case: Case, **extra: Any) -> Any:
    """The completion answering ``case`` through ``model``."""
    return client.completions.create(
        model=model,
        prompt=case.prompt,
        n=case.width,
        max_tokens=case.max_tokens,
        extra_body=case.body(),
        **extra,
    )


def check_log_probs(reply: Any, case: Case, reference: Reference) -> None:
    """Each choice carries its beam's log probs: transformers' for that beam (the end token
    left out) and, summed, the model's own score of its tokens, within 1e-3."""
    for choice, beam, own in zip(reply.choices, reference.beams, reference.own, strict=True):
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        assert choice.logprobs.token_logprobs == pytest.approx(beam.log_probs, abs=1e-3)
        total = sum(choice.logprobs.token_logprobs)
        assert total == pytest.approx(sum(beam.log_probs), abs=1e-3)
        assert total == pytest.approx(own, abs=1e-3)
