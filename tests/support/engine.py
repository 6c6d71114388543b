"""The in-process torch engine's test helpers: requests, their collected outputs, and
transformers' greedy reference."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from deploy.triton.engine.scheduler import Engine
from deploy.triton.engine.types import (
    EngineRequest,
    SamplingConfig,
    SequenceOutput,
)

TIMEOUT_S = 60.0

GREEDY = SamplingConfig(temperature=0.0, min_tokens=0)

SAMPLED = SamplingConfig(temperature=1.5, top_p=1.0, seed=42)

MAX_SEQ_LEN = 256


@dataclass
class Result:
    """Everything one request's callback received."""

    expected: int
    outputs: list[SequenceOutput] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def __call__(self, output: SequenceOutput) -> None:
        self.outputs.append(output)
        if sum(o.finished for o in self.outputs) == self.expected:
            self.done.set()

    def wait(self) -> Result:
        assert self.done.wait(TIMEOUT_S), "the engine did not finish the request"
        return self

    def tokens(self, index: int = 0) -> list[int]:
        return [t for o in self.outputs if o.sequence_index == index for t in o.token_ids.tolist()]

    def final(self, index: int = 0) -> SequenceOutput:
        return next(o for o in self.outputs if o.sequence_index == index and o.finished)


_ids = iter(range(1_000_000))


def make(prompt: tuple[int, ...], max_new: int = 24, **overrides: Any) -> EngineRequest:
    values: dict[str, Any] = {"sampling": GREEDY}
    return EngineRequest(f"r{next(_ids)}", prompt, max_new, **(values | overrides))


def submit(engine: Engine, request: EngineRequest) -> Result:
    result = Result(request.num_return_sequences)
    engine.submit(request, result)
    return result


def run(engine: Engine, request: EngineRequest) -> Result:
    return submit(engine, request).wait()


def reference(hf_model: Any, prompt: tuple[int, ...], max_new: int = 24) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new,
        )
    tokens: list[int] = out[0, len(prompt) :].tolist()
    eos = hf_model.generation_config.eos_token_id
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def fresh_index(tokens: list[int], start: int = 1) -> int:
    """The first position from `start` whose token did not occur before it."""
    return next(i for i in range(start, len(tokens)) if tokens[i] not in tokens[:i])


def _beam_generate(
    hf_model: Any, prompt: tuple[int, ...], width: int, max_new: int, end: int, **options: Any
) -> Any:
    """transformers' ``generate(num_beams=width)`` returning every beam, best first.
    ``renormalize_logits`` makes its scores the log-softmax of the processed logits (suppressed
    tokens removed), which is what TensorRT-LLM's beam search scores."""
    with torch.no_grad():
        return hf_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            num_beams=width,
            num_return_sequences=width,
            max_new_tokens=max_new,
            renormalize_logits=True,
            eos_token_id=end,
            pad_token_id=end,
            **options,
        )


def _generated(sequence: Any, prompt: tuple[int, ...], end: int) -> list[int]:
    """A beam's generated tokens, cut before the end token."""
    tokens: list[int] = sequence[len(prompt) :].tolist()
    return tokens[: tokens.index(end)] if end in tokens else tokens


def beam_reference(
    hf_model: Any,
    prompt: tuple[int, ...],
    width: int,
    max_new: int,
    *,
    length_penalty: float = 0.0,
    early_stopping: bool | str = True,
    eos: int | None = None,
) -> list[list[int]]:
    """transformers' beams of ``generate(num_beams=width)``, best first, cut at the end token."""
    end = hf_model.generation_config.eos_token_id if eos is None else eos
    out = _beam_generate(
        hf_model, prompt, width, max_new, end,
        length_penalty=length_penalty, early_stopping=early_stopping,
    )  # fmt: skip
    return [_generated(sequence, prompt, end) for sequence in out]


def beam_texts(model_dir: Any, text: str, width: int, max_new: int) -> list[str]:
    """transformers' beams of ``text``, best first, decoded as the pipelines decode them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    beams = beam_reference(model, tuple(tokenizer.encode(text)), width, max_new)
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in beams]


def beam_log_probs(
    hf_model: Any, prompt: tuple[int, ...], width: int, max_new: int
) -> list[list[float]]:
    """Each of transformers' beams' per-token log probs (log-softmax of the processed logits
    along the beam's own history), best beam first, to the end token."""
    end = hf_model.generation_config.eos_token_id
    out = _beam_generate(
        hf_model, prompt, width, max_new, end,
        length_penalty=0.0, return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    with torch.no_grad():
        scores = hf_model.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    return [
        row[: len(_generated(sequence, prompt, end))].tolist()
        for sequence, row in zip(out.sequences, scores, strict=True)
    ]


@dataclass(frozen=True)
class ReferenceBeam:
    """One of transformers' beams: its generated tokens (cut before the end token), their log
    probs, and its cumulative log prob (an ended beam's holds its end token's too, as
    TensorRT-LLM's does)."""

    tokens: list[int]
    log_probs: list[float]
    cum_log_prob: float


def beam_search_reference(
    hf_model: Any,
    prompt: tuple[int, ...],
    width: int,
    max_new: int,
    *,
    min_new: int = 0,
    length_penalty: float = 0.0,
) -> list[ReferenceBeam]:
    """transformers' beams of ``generate(num_beams=width, min_new_tokens=min_new)``, best
    first, scored by the log-softmax of the processed logits along each beam's own history."""
    end = hf_model.generation_config.eos_token_id
    out = _beam_generate(
        hf_model, prompt, width, max_new, end,
        length_penalty=length_penalty, min_new_tokens=min_new,
        return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    with torch.no_grad():
        scores = hf_model.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    beams = []
    for sequence, row in zip(out.sequences, scores, strict=True):
        tokens = _generated(sequence, prompt, end)
        values = row.tolist()
        beams.append(ReferenceBeam(tokens, values[: len(tokens)], float(row.sum())))
    return beams


def own_log_prob(
    hf_model: Any, prompt: tuple[int, ...], tokens: list[int], *, min_new: int = 0
) -> float:
    """The model's own score of ``tokens`` after ``prompt``: the sum of each token's
    log-softmax of the logits of one forward pass, less the tokens its generation config
    suppresses (``begin_suppress_tokens`` at the first position) and the end token in the first
    ``min_new`` positions (where ``min_tokens`` bans it)."""
    config = hf_model.generation_config
    with torch.no_grad():
        logits = hf_model(torch.tensor([[*prompt, *tokens]])).logits[0].float()
    logits = logits[len(prompt) - 1 : -1].clone()
    logits[:, list(config.suppress_tokens or [])] = float("-inf")
    logits[0, list(config.begin_suppress_tokens or [])] = float("-inf")
    logits[:min_new, config.eos_token_id] = float("-inf")
    log_probs = torch.log_softmax(logits, dim=-1)
    return float(log_probs.gather(1, torch.tensor(tokens).unsqueeze(1)).sum())
