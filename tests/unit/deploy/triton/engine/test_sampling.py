"""Pure logic of the torch engine: sampling, logits processing, KV-cache batching, limits."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from deploy.triton.engine.checks import validate_request
from deploy.triton.engine.sampling import (
    SamplingRows,
    apply_penalties,
    banned_next_tokens,
    choose_tokens,
    ends_with,
    filter_top_k_top_p,
    hits_stop_word,
    sample_from_logits,
    sequence_seed,
    static_bias,
    token_log_probs,
)
from deploy.triton.engine.types import EngineError, EngineRequest, SamplingConfig

INF = float("inf")


@pytest.mark.parametrize(
    ("params", "greedy"),
    [
        (SamplingConfig(), True),
        (SamplingConfig(temperature=0.0, top_p=0.9), True),
        (SamplingConfig(top_k=1, temperature=1.5), True),
        (SamplingConfig(top_k=5), False),
        (SamplingConfig(top_p=0.9), False),
        (SamplingConfig(top_k=0, top_p=0.0, temperature=0.7), True),
        (SamplingConfig(top_k=50, top_p=0.95, temperature=0.7), False),
    ],
)
def test_greedy_follows_tensorrt_llm_rules(params: SamplingConfig, greedy: bool) -> None:
    assert params.greedy is greedy


def test_sequence_seeds_are_stable_and_distinct() -> None:
    seeds = [sequence_seed(7, i) for i in range(4)]
    assert seeds[0] == 7
    assert len(set(seeds)) == 4
    assert seeds == [sequence_seed(7, i) for i in range(4)]
    assert all(0 <= s < 2**64 for s in [*seeds, sequence_seed(2**64 - 1, 3)])


@pytest.mark.parametrize(
    ("tokens", "word", "expected"),
    [
        ([1, 2, 3], [3], True),
        ([1, 2, 3], [2, 3], True),
        ([1, 2, 3], [1, 3], False),
        ([3], [2, 3], False),
        ([1, 2], [], False),
    ],
)
def test_ends_with(tokens: list[int], word: list[int], expected: bool) -> None:
    assert ends_with(tokens, word) is expected


def test_stop_word_hit_needs_a_complete_word_at_the_end() -> None:
    words = ((5, 6), (9,))
    assert hits_stop_word([1, 5, 6], words)
    assert hits_stop_word([9], words)
    assert not hits_stop_word([5, 6, 1], words)


@pytest.mark.parametrize(
    ("history", "generated", "min_tokens", "bad", "begin", "expected"),
    [
        ([1, 2], 0, 1, (), (), [2]),
        ([1, 2], 1, 1, (), (), []),
        ([1, 2], 3, 5, (), (), [2]),
        ([1, 7, 8], 2, 0, ((7, 8, 9),), (), [9]),
        ([1, 7], 1, 0, ((7, 8, 9),), (), []),
        ([1, 4], 1, 0, ((4,),), (), []),
        ([1], 0, 0, (), (11, 12), [11, 12]),
        ([1, 3], 1, 0, (), (11,), []),
    ],
)
def test_banned_next_tokens(
    history: list[int],
    generated: int,
    min_tokens: int,
    bad: tuple[tuple[int, ...], ...],
    begin: tuple[int, ...],
    expected: list[int],
) -> None:
    assert banned_next_tokens(history, generated, min_tokens, (2,), bad, begin) == expected


def test_static_bias_bans_suppressed_and_single_bad_words_and_adds_embedding_bias() -> None:
    embedding = np.arange(6, dtype=np.float32)
    bias = static_bias(6, [0], ((3,), (4, 5)), embedding)
    assert bias.tolist() == [-INF, 1.0, 2.0, -INF, 4.0, 5.0]
    assert static_bias(4, [], (), None).tolist() == [0.0] * 4


@pytest.mark.parametrize(
    ("logits", "seen", "counts", "rep", "pres", "freq", "expected"),
    [
        ([2.0, -2.0, 1.0], [1, 1, 0], [0, 0, 0], 2.0, 0.0, 0.0, [1.0, -4.0, 1.0]),
        ([2.0, -2.0, 1.0], [0, 0, 0], [0, 0, 0], 2.0, 0.0, 0.0, [2.0, -2.0, 1.0]),
        ([1.0, 1.0, 1.0], [0, 0, 0], [0, 3, 1], 1.0, 0.5, 0.0, [1.0, 0.5, 0.5]),
        ([1.0, 1.0, 1.0], [0, 0, 0], [0, 3, 1], 1.0, 0.0, 0.25, [1.0, 0.25, 0.75]),
    ],
)
def test_apply_penalties(
    logits: list[float],
    seen: list[int],
    counts: list[int],
    rep: float,
    pres: float,
    freq: float,
    expected: list[float],
) -> None:
    out = apply_penalties(
        torch.tensor([logits]),
        torch.tensor([seen], dtype=torch.bool),
        torch.tensor([counts], dtype=torch.float32),
        torch.tensor([rep]),
        torch.tensor([pres]),
        torch.tensor([freq]),
    )
    assert out[0].tolist() == pytest.approx(expected)


@pytest.mark.parametrize(
    ("top_k", "top_p", "kept"),
    [
        (0, 0.0, {0, 1, 2, 3}),
        (2, 0.0, {0, 1}),
        (1, 1.0, {0}),
        (0, 0.5, {0}),
        (0, 0.7, {0, 1}),
        (3, 0.75, {0, 1}),
        (0, 1.0, {0, 1, 2, 3}),
    ],
)
def test_filter_top_k_top_p(top_k: int, top_p: float, kept: set[int]) -> None:
    probs = torch.tensor([[0.1, 0.6, 0.05, 0.25]])
    masked, order = filter_top_k_top_p(probs.log(), torch.tensor([top_k]), torch.tensor([top_p]))
    survivors = {int(order[0, i]) for i in range(4) if masked[0, i] > -INF}
    rank_of = {1: 0, 3: 1, 0: 2, 2: 3}
    assert {rank_of[token] for token in survivors} == kept


@pytest.mark.parametrize(
    ("uniform", "token"),
    [(0.0, 1), (0.2, 1), (0.49, 1), (0.51, 3), (0.999999, 3)],
)
def test_sample_from_logits_inverts_the_cdf_and_skips_impossible_tokens(
    uniform: float, token: int
) -> None:
    logits = torch.tensor([[-INF, 0.0, -INF, 0.0, -INF]])
    assert sample_from_logits(logits, torch.tensor([uniform], dtype=torch.float64)).item() == token


def test_choose_tokens_argmax_for_greedy_rows_and_sampling_for_the_others() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    out = choose_tokens(
        logits,
        temperature=torch.tensor([1.0, 1.0]),
        top_k=torch.tensor([0, 0]),
        top_p=torch.tensor([0.0, 0.99]),
        greedy=torch.tensor([True, False]),
        uniforms=torch.tensor([0.999, 0.999], dtype=torch.float64),
    )
    assert out.tolist() == [1, 0]


def test_high_temperature_flattens_and_low_temperature_sharpens() -> None:
    logits = torch.tensor([[0.0, 2.0]] * 2)
    uniforms = torch.tensor([0.3, 0.3], dtype=torch.float64)
    out = choose_tokens(
        logits,
        temperature=torch.tensor([100.0, 0.05]),
        top_k=torch.tensor([0, 0]),
        top_p=torch.tensor([1.0, 1.0]),
        greedy=torch.tensor([False, False]),
        uniforms=uniforms,
    )
    assert out.tolist() == [0, 1]


def test_token_log_probs_are_log_softmax_of_the_raw_logits() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]])
    assert token_log_probs(logits, torch.tensor([1])).item() == pytest.approx(math.log(0.75))


def _rows(seeds: list[int], params: SamplingConfig, prompt: tuple[int, ...] = ()) -> SamplingRows:
    return SamplingRows.for_request(params, seeds, torch.zeros(5), prompt, torch.device("cpu"))


def test_sampling_rows_are_reproducible_per_seed_whatever_the_batch() -> None:
    params = SamplingConfig(temperature=1.0, top_p=1.0)
    logits = torch.zeros(1, 5)
    alone = [_rows([11], params).choose(logits, []).item() for _ in range(3)]
    assert len(set(alone)) == 1
    batch = _rows([99], params)
    batch.extend(_rows([11, 12], params))
    assert batch.choose(logits.repeat(3, 1), [])[1].item() == alone[0]
    others = {_rows([seed], params).choose(logits, []).item() for seed in range(20)}
    assert len(others) > 1


def test_sampling_rows_select_extend_and_record_keep_rows_aligned() -> None:
    penalised = SamplingConfig(presence_penalty=5.0)
    rows = _rows([1], SamplingConfig())
    rows.extend(_rows([2, 3], penalised, prompt=(4,)))
    rows.record(torch.tensor([0, 1, 2]))
    rows.select([2, 0])
    assert [p.presence_penalty for p in rows.params] == [5.0, 0.0]
    assert rows.counts[0].tolist() == [0, 0, 1, 0, 0]
    assert rows.seen[0].tolist() == [False, False, True, False, True]
    logits = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0]] * 2)
    assert rows.choose(logits, [(1, 2)]).tolist() == [0, 0]


def _request(**overrides: Any) -> EngineRequest:
    values: dict[str, Any] = {"request_id": "r", "input_ids": (1, 2, 3), "max_new_tokens": 5}
    return EngineRequest(**(values | overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"input_ids": ()}, "input_ids is empty"),
        ({"max_new_tokens": 0}, "at least 1"),
        ({"num_return_sequences": 5}, "num_return_sequences"),
        ({"input_ids": (1,) * 8}, "no room is left"),
        ({"input_ids": (1, 50)}, "outside the vocabulary"),
        ({"stop_words": ((99,),)}, "stop_words_list"),
        ({"sampling": SamplingConfig(temperature=-1.0)}, "temperature"),
        ({"sampling": SamplingConfig(top_p=1.5)}, "runtime_top_p"),
        ({"embedding_bias": np.zeros(3, np.float32)}, "embedding_bias"),
    ],
)
def test_validate_request_errors(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(EngineError, match=message):
        validate_request(_request(**overrides), vocab_size=32, max_seq_len=8, max_batch_size=4)


@pytest.mark.parametrize(("max_new", "expected"), [(5, 5), (6, 5), (2, 2)])
def test_validate_request_caps_output_to_the_sequence_limit(max_new: int, expected: int) -> None:
    request = _request(max_new_tokens=max_new)
    assert validate_request(request, vocab_size=32, max_seq_len=8, max_batch_size=4) == expected


def test_the_device_defaults_to_cuda_only_where_there_is_one() -> None:
    from deploy.triton.engine.runner import resolve_device
    from deploy.triton.engine.types import EngineError

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(EngineError, match="not a torch device"):
        resolve_device("gpu-please")
    if not torch.cuda.is_available():
        with pytest.raises(EngineError, match=r"no CUDA device.*device: auto or cpu"):
            resolve_device("cuda:1")
