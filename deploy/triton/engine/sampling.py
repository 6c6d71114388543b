"""Logits processing and token selection for a batch of sequences, vectorised over rows."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt
import torch

from deploy.triton.engine.types import SamplingConfig, TokenIds, WordList

logger = logging.getLogger(__name__)

_GOLDEN = 0x9E3779B97F4A7C15
_U64 = (1 << 64) - 1
_TOP_P_FLOOR = 1e-6  # TensorRT-LLM's default runtime_top_p_min


def sequence_seed(seed: int, index: int) -> int:
    """The seed of the `index`-th sequence of a request: distinct per index, stable per seed."""
    return (seed + index * _GOLDEN) & _U64


def make_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with an unsigned 64-bit seed."""
    generator = torch.Generator()
    generator.manual_seed(seed & _U64)
    return generator


def ends_with(tokens: Sequence[int], word: Sequence[int]) -> bool:
    """Whether `tokens` ends with `word` (an empty word never matches)."""
    n = len(word)
    return 0 < n <= len(tokens) and list(tokens[-n:]) == list(word)


def hits_stop_word(generated: Sequence[int], stop_words: WordList) -> bool:
    """Whether the generated tokens end with one of the stop words."""
    return any(ends_with(generated, word) for word in stop_words)


def banned_next_tokens(
    history: Sequence[int],
    generated: int,
    min_tokens: int,
    end_ids: TokenIds,
    bad_words: WordList,
    begin_suppress: TokenIds = (),
) -> list[int]:
    """Tokens that must not come next, beyond the static bans of `static_bias`.

    End ids are banned until `min_tokens` tokens exist, `begin_suppress` on the first token,
    and the last token of a multi-token bad word when `history` ends with the rest of it.
    """
    bans: list[int] = []
    if generated < min_tokens:
        bans.extend(end_ids)
    if generated == 0:
        bans.extend(begin_suppress)
    for word in bad_words:
        if len(word) > 1 and ends_with(history, word[:-1]):
            bans.append(word[-1])
    return bans


def static_bias(
    vocab_size: int,
    suppressed: Iterable[int],
    bad_words: WordList,
    embedding_bias: npt.NDArray[np.float32] | None,
) -> torch.Tensor:
    """The additive logit bias of a request: -inf on suppressed and single-token bad words."""
    bias = torch.zeros(vocab_size, dtype=torch.float32)
    if embedding_bias is not None and embedding_bias.size:
        values = torch.from_numpy(np.asarray(embedding_bias, dtype=np.float32).reshape(-1))
        bias[: values.numel()] += values[:vocab_size]
    banned = [*suppressed, *(word[0] for word in bad_words if len(word) == 1)]
    if banned:
        bias[torch.tensor(banned, dtype=torch.long)] = float("-inf")
    return bias


def apply_penalties(
    logits: torch.Tensor,
    seen: torch.Tensor,
    counts: torch.Tensor,
    repetition: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
) -> torch.Tensor:
    """Repetition penalty on tokens seen in prompt or output, presence/frequency on the output."""
    rep = repetition.unsqueeze(1)
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalised, logits)
    return logits - frequency.unsqueeze(1) * counts - presence.unsqueeze(1) * (counts > 0)


def filter_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each row descending and mask it to its top-k, then to its top-p nucleus.

    `top_k` <= 0 and `top_p` <= 0 or >= 1 disable the filters row by row. Returns the masked
    sorted logits and the sort order (token id of each sorted position).
    """
    vocab = logits.shape[-1]
    ordered, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab).unsqueeze(1)
    ordered = ordered.masked_fill(ranks >= k, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    before = probs.cumsum(dim=-1) - probs
    p = top_p.unsqueeze(1)
    drop = (before >= p) & (p > 0) & (p < 1)
    return ordered.masked_fill(drop, float("-inf")), order


def sample_from_logits(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: row r takes the first token whose CDF exceeds `uniforms[r]` (0..1)."""
    probs = torch.softmax(logits.double(), dim=-1)
    cdf = probs.cumsum(dim=-1)
    target = uniforms.to(cdf).unsqueeze(1) * cdf[:, -1:]
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    last_possible = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(dim=-1)
    return torch.minimum(index, last_possible)


def choose_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    greedy: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Arg-max for greedy rows; temperature, top-k, top-p and sampling for the others."""
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / scale.unsqueeze(1)
    filtering = bool(((top_k > 0) | ((top_p > 0) & (top_p < 1))).any())
    if filtering:
        masked, order = filter_top_k_top_p(scaled, top_k, top_p)
        sampled = order.gather(1, sample_from_logits(masked, uniforms).unsqueeze(1)).squeeze(1)
    else:
        sampled = sample_from_logits(scaled, uniforms)
    return torch.where(greedy, logits.argmax(dim=-1), sampled)


def _guide(
    processed: torch.Tensor, raw: torch.Tensor, rows: list[int], allowed: torch.Tensor
) -> torch.Tensor:
    """Mask the guided rows to their grammars' tokens (see ``SamplingRows.choose``)."""
    index = torch.tensor(rows, dtype=torch.long, device=processed.device)
    guided = processed[index].masked_fill(~allowed, float("-inf"))
    dead = ~torch.isfinite(guided).any(dim=-1)
    if bool(dead.any()):
        fallback = raw[index].float().masked_fill(~allowed, float("-inf"))
        guided = torch.where(dead.unsqueeze(1), fallback, guided)
    processed[index] = guided
    return processed


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Log-probability of each row's chosen token under the model's unprocessed distribution."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1)


class SamplingRows:
    """Row-aligned sampling state of the sequences of a batch (rows follow the KV cache)."""

    def __init__(
        self,
        params: list[SamplingConfig],
        generators: list[torch.Generator],
        bias: torch.Tensor,
        seen: torch.Tensor,
    ) -> None:
        self.params = params
        self.generators = generators
        self.bias = bias
        self.seen = seen
        self.counts = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
        self.current_top_p = [p.top_p for p in params]
        self._refresh()

    @classmethod
    def empty(cls, vocab_size: int, device: torch.device) -> SamplingRows:
        """A state with no rows."""
        bias = torch.zeros((0, vocab_size), dtype=torch.float32, device=device)
        return cls([], [], bias, bias.bool())

    @classmethod
    def for_request(
        cls,
        params: SamplingConfig,
        seeds: Sequence[int],
        bias: torch.Tensor,
        prompt: Sequence[int],
        device: torch.device,
    ) -> SamplingRows:
        """Rows for the sequences of one request: same parameters, one generator each."""
        n = len(seeds)
        seen = torch.zeros(bias.shape[-1], dtype=torch.bool)
        vocab = [token for token in prompt if token < seen.numel()]
        if params.penalised and vocab:
            seen[torch.tensor(vocab, dtype=torch.long)] = True
        return cls(
            [params] * n,
            [make_generator(seed) for seed in seeds],
            bias.to(device).unsqueeze(0).repeat(n, 1),
            seen.to(device).unsqueeze(0).repeat(n, 1),
        )

    def __len__(self) -> int:
        return len(self.params)

    def _refresh(self) -> None:
        device = self.bias.device

        def column(values: list[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        self.temperature = column([p.temperature for p in self.params])
        self.top_k = column([p.top_k for p in self.params], torch.long)
        self.top_p = column(self.current_top_p)
        self.repetition = column([p.repetition_penalty for p in self.params])
        self.presence = column([p.presence_penalty for p in self.params])
        self.frequency = column([p.frequency_penalty for p in self.params])
        self.greedy = column([p.greedy for p in self.params], torch.bool)
        self.all_greedy = all(p.greedy for p in self.params)
        self.any_penalty = any(p.penalised for p in self.params)
        self.any_decay = any(p.decays for p in self.params)

    def select(self, rows: Sequence[int]) -> None:
        """Keep only `rows`, in that order."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.bias.device)
        self.params = [self.params[r] for r in rows]
        self.generators = [self.generators[r] for r in rows]
        self.current_top_p = [self.current_top_p[r] for r in rows]
        self.bias, self.seen, self.counts = (
            self.bias[index],
            self.seen[index],
            self.counts[index],
        )
        self._refresh()

    def extend(self, other: SamplingRows) -> None:
        """Append the rows of `other`."""
        self.params = self.params + other.params
        self.generators = self.generators + other.generators
        self.current_top_p = self.current_top_p + other.current_top_p
        self.bias = torch.cat([self.bias, other.bias])
        self.seen = torch.cat([self.seen, other.seen])
        self.counts = torch.cat([self.counts, other.counts])
        self._refresh()

    def record(self, tokens: torch.Tensor) -> None:
        """Count the chosen tokens for the penalties and decay top-p, where rows need it."""
        if self.any_decay:
            self._decay_top_p(tokens.tolist())
        if not self.any_penalty:
            return
        rows = torch.arange(len(self), device=tokens.device)
        self.counts[rows, tokens] += 1.0
        self.seen[rows, tokens] = True

    def _decay_top_p(self, tokens: list[int]) -> None:
        """TensorRT-LLM's rule: back to the initial top-p on the reset id, else decay it."""
        for row, (params, token) in enumerate(zip(self.params, tokens, strict=True)):
            if not params.decays:
                continue
            if token == params.top_p_reset_id:
                self.current_top_p[row] = params.top_p
            else:
                decayed = self.current_top_p[row] * params.top_p_decay
                self.current_top_p[row] = max(decayed, _TOP_P_FLOOR)
        self.top_p = torch.tensor(self.current_top_p, dtype=torch.float32, device=self.bias.device)

    def copy_rows(self, targets: Sequence[int], sources: Sequence[int]) -> None:
        """Row ``targets[i]`` takes the penalty and top-p state of row ``sources[i]`` (a beam
        continuing another beam's tokens)."""
        if not targets:
            return
        index = torch.arange(len(self), device=self.bias.device)
        index[torch.tensor(list(targets), dtype=torch.long, device=index.device)] = torch.tensor(
            list(sources), dtype=torch.long, device=index.device
        )
        self.seen, self.counts = self.seen[index], self.counts[index]
        rows = index.tolist()
        self.current_top_p = [self.current_top_p[r] for r in rows]
        self.top_p = torch.tensor(self.current_top_p, dtype=torch.float32, device=self.bias.device)

    def process(
        self,
        logits: torch.Tensor,
        bans: Sequence[tuple[int, int]],
        allowed: tuple[list[int], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The raw logits [rows, vocab] with each row's bias, bans, grammar and penalties.

        ``allowed`` holds the guided rows and the tokens their grammars allow. Where the bans
        leave a guided row nothing its grammar allows, the grammar alone decides: a grammar
        that can only end gets its stop token even when the model suppresses it.
        """
        processed = logits.float() + self.bias
        if bans:
            rows, cols = zip(*bans, strict=True)
            processed[list(rows), list(cols)] = float("-inf")
        if allowed is not None:
            processed = _guide(processed, logits, *allowed)
        if self.any_penalty:
            processed = apply_penalties(
                processed,
                self.seen,
                self.counts,
                self.repetition,
                self.presence,
                self.frequency,
            )
        return processed

    def pick(self, processed: torch.Tensor) -> torch.Tensor:
        """One token per row of the processed logits: arg-max or sampled, row by row."""
        if self.all_greedy:
            return processed.argmax(dim=-1)
        uniforms = torch.tensor(
            [
                0.0 if p.greedy else float(torch.rand((), dtype=torch.float64, generator=g))
                for p, g in zip(self.params, self.generators, strict=True)
            ],
            dtype=torch.float64,
        )
        return choose_tokens(
            processed, self.temperature, self.top_k, self.top_p, self.greedy, uniforms
        )

    def choose(
        self,
        logits: torch.Tensor,
        bans: Sequence[tuple[int, int]],
        allowed: tuple[list[int], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Process the raw logits [rows, vocab] and pick one token per row."""
        return self.pick(self.process(logits, bans, allowed))
