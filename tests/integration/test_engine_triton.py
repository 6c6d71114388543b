"""The torch engine's `tensorrt_llm` model inside a real tritonserver, over gRPC streaming."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient

from deploy.sidecar.supervisor import Sidecar
from tests.support.engine_grpc import (
    MODEL,
    PROMPT,
    Stream,
    request,
    tokens_of,
)
from tests.support.prometheus import value

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def greedy(tiny_model_dir: Path) -> Any:
    """Greedy continuations computed by transformers' `generate`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    eos = model.generation_config.eos_token_id

    def continuation(prompt: tuple[int, ...], max_new: int, stop_at_eos: bool = True) -> list[int]:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=max_new,
                eos_token_id=eos if stop_at_eos else None,
            )
        tokens: list[int] = out[0, len(prompt) :].tolist()
        return tokens[: tokens.index(eos)] if stop_at_eos and eos in tokens else tokens

    return continuation


def test_non_streamed_output_is_the_prompt_plus_the_greedy_continuation(
    sidecar: Sidecar, greedy: Any
) -> None:
    responses = Stream(sidecar, request(16)).collect()
    assert len(responses) == 1
    outputs, final = responses[0]
    assert final
    expected = [*PROMPT, *greedy(PROMPT, 16)]
    assert outputs["output_ids"].tolist() == [[expected]]
    assert outputs["sequence_length"].tolist() == [[len(expected)]]


def test_streamed_chunks_hold_one_new_token_each(sidecar: Sidecar, greedy: Any) -> None:
    responses = Stream(sidecar, request(12, streaming=True, end_id=-1)).collect()
    expected = greedy(PROMPT, 12, stop_at_eos=False)
    assert [outputs["output_ids"].tolist() for outputs, _ in responses] == [
        [[[t]]] for t in expected
    ]
    assert [final for _, final in responses] == [False] * 11 + [True]


def test_end_id_ends_a_stream_with_an_empty_final_chunk(sidecar: Sidecar, greedy: Any) -> None:
    full = greedy(PROMPT, 16, stop_at_eos=False)
    at = next(i for i in range(2, len(full)) if full[i] not in full[:i])
    responses = Stream(sidecar, request(16, streaming=True, end_id=full[at])).collect()
    assert tokens_of(responses) == full[:at]
    last, final = responses[-1]
    assert final
    assert last["output_ids"].shape == (1, 1, 0)


def test_concurrent_streams_decode_as_they_would_alone(sidecar: Sidecar, greedy: Any) -> None:
    prompts = [PROMPT[: 2 + i] for i in range(4)] + [PROMPT * 3, (5, 6, 7)]
    streams = [Stream(sidecar, request(10 + i, p, streaming=True)) for i, p in enumerate(prompts)]
    for i, (prompt, stream) in enumerate(zip(prompts, streams, strict=True)):
        assert tokens_of(stream.collect()) == greedy(prompt, 10 + i)


def test_log_probs_on_request(sidecar: Sidecar) -> None:
    outputs, _ = Stream(
        sidecar, request(6, return_log_probs=True, exclude_input_in_output=True, end_id=-1)
    ).collect()[0]
    log_probs = outputs["output_log_probs"].reshape(-1)
    assert outputs["output_ids"].shape == (1, 1, 6)
    assert log_probs.shape == (6,)
    assert (log_probs <= 0).all()
    assert float(outputs["cum_log_probs"][0, 0]) == pytest.approx(float(log_probs.sum()), abs=1e-3)


@pytest.fixture
def count_flags(sidecar: Sidecar) -> dict[str, Any]:
    """The inputs that ask for both token counts; skips where the config declares no counts."""
    client = grpcclient.InferenceServerClient(sidecar.grpc_url)
    config = client.get_model_config(MODEL, as_json=True)["config"]
    client.close()
    if "num_output_tokens" not in {o["name"] for o in config["output"]}:
        pytest.skip("the rendered tensorrt_llm config has no num_input/num_output_tokens")
    return {"return_num_input_tokens": True, "return_num_output_tokens": True}


def test_token_counts_when_the_config_declares_them(
    sidecar: Sidecar, count_flags: dict[str, Any]
) -> None:
    streamed = Stream(sidecar, request(5, streaming=True, end_id=-1, **count_flags)).collect()
    assert [o["num_output_tokens"].tolist() for o, _ in streamed] == [[[1]]] * 5
    assert {int(o["num_input_tokens"][0, 0]) for o, _ in streamed} == {len(PROMPT)}
    whole, _ = Stream(sidecar, request(5, end_id=-1, **count_flags)).collect()[0]
    assert whole["num_output_tokens"].tolist() == [[len(PROMPT) + 5]]


def test_counts_of_concurrent_streams_are_each_their_own(
    sidecar: Sidecar, count_flags: dict[str, Any]
) -> None:
    """The engine shares one tensor among responses with the same count; streams of different
    prompt lengths in flight at once must each still get their own counts."""
    prompts = [PROMPT[:length] for length in range(2, len(PROMPT) + 1)]
    streams = [
        (prompt, Stream(sidecar, request(4, prompt, streaming=True, end_id=-1, **count_flags)))
        for prompt in prompts
    ]
    wholes = [
        (prompt, Stream(sidecar, request(3, prompt, end_id=-1, **count_flags)))
        for prompt in prompts
    ]
    for prompt, stream in streams:
        responses = stream.collect()
        assert [int(o["num_input_tokens"][0, 0]) for o, _ in responses] == [len(prompt)] * 4
        assert [int(o["num_output_tokens"][0, 0]) for o, _ in responses] == [1] * 4
        assert [int(o["sequence_length"][0, 0]) for o, _ in responses] == [1] * 4
    for prompt, stream in wholes:
        whole, _ = stream.collect()[0]
        assert int(whole["num_input_tokens"][0, 0]) == len(prompt)
        assert int(whole["num_output_tokens"][0, 0]) == len(prompt) + 3
        assert int(whole["sequence_length"][0, 0]) == len(prompt) + 3


def test_num_return_sequences_answer_once_per_sequence(sidecar: Sidecar) -> None:
    values = request(
        8,
        num_return_sequences=3,
        temperature=1.5,
        runtime_top_p=1.0,
        seed=np.array([[7]], np.uint64),
        exclude_input_in_output=True,
        end_id=-1,
    )
    responses = Stream(sidecar, values).collect()
    assert sorted(int(o["sequence_index"][0, 0]) for o, _ in responses) == [0, 1, 2]
    assert [final for _, final in responses] == [False, False, True]
    samples = {tuple(tokens_of(responses, i)) for i in range(3)}
    assert len(samples) == 3
    again = Stream(sidecar, values).collect()
    assert {tuple(tokens_of(again, i)) for i in range(3)} == samples


def test_batch_items_answer_with_their_batch_index(sidecar: Sidecar, greedy: Any) -> None:
    values = {
        "input_ids": np.array([[*PROMPT], [5, 6, 7, 0, 0]], np.int32),
        "input_lengths": np.array([[5], [3]], np.int32),
        "request_output_len": np.array([[4], [6]], np.int32),
        "exclude_input_in_output": np.array([[True], [True]]),
    }
    responses = Stream(sidecar, values).collect()
    by_item = {
        int(o["batch_index"][0, 0]): o["output_ids"].reshape(-1).tolist() for o, _ in responses
    }
    assert by_item == {0: greedy(PROMPT, 4), 1: greedy((5, 6, 7), 6)}
    assert [final for _, final in responses] == [False, True]


def _long_stream(sidecar: Sidecar) -> Stream:
    stream = Stream(sidecar, request(3000, streaming=True, end_id=-1))
    outputs, final = stream.next()
    assert outputs["output_ids"].shape == (1, 1, 1)
    assert not final
    return stream


def test_stop_request_ends_the_running_request(sidecar: Sidecar) -> None:
    running = _long_stream(sidecar)
    stop = {
        "input_ids": np.array([[0]], np.int32),
        "input_lengths": np.array([[0]], np.int32),
        "request_output_len": np.array([[0]], np.int32),
        "stop": np.array([[True]]),
    }
    answer = Stream(sidecar, stop, request_id=running.request_id).collect()
    assert answer == [({}, True)]
    rest = running.collect()
    assert rest[-1][1]
    assert len(tokens_of(rest)) < 2999


def test_stop_request_without_an_id_is_an_error(sidecar: Sidecar) -> None:
    stop = request(0, (0,), stop=True)
    assert "request ID is not provided" in Stream(sidecar, stop, request_id="").error()


def test_client_cancellation_stops_generation(sidecar: Sidecar) -> None:
    running = _long_stream(sidecar)
    running.close(cancel=True)
    line = f"request {running.request_id!r} cancelled by the client"
    deadline = time.monotonic() + 10
    while line not in sidecar.log_tail(400) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert line in sidecar.log_tail(400)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"lora_task_id": np.array([[987654]], np.uint64)},
            "LoRA task 987654 not found in cache. Please send LoRA weights with request",
        ),
        (
            {
                "lora_weights": np.ones((1, 2, 8), np.float16),
                "lora_config": np.ones((1, 2, 3), np.int32),
            },
            "lora_task_id must be set for LoRA inference",
        ),
        ({"beam_width": 8}, "max_beam_width 4"),
        ({"prompt": PROMPT * 1000}, "torch_max_seq_len"),
    ],
)
def test_unsupported_requests_get_a_clear_error(
    sidecar: Sidecar, extra: dict[str, Any], message: str
) -> None:
    prompt = extra.pop("prompt", PROMPT)
    assert message in Stream(sidecar, request(4, prompt, **extra)).error()
    assert Stream(sidecar, request(2)).collect()[-1][1]


def test_context_and_generation_logits_are_the_models_logits(
    sidecar: Sidecar, tiny_model_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    flags = {"return_context_logits": True, "return_generation_logits": True}
    values = request(4, exclude_input_in_output=True, end_id=-1, **flags)
    ((outputs, final),) = Stream(sidecar, values).collect()
    generated = outputs["output_ids"].reshape(-1).tolist()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        logits = model(torch.tensor([list(PROMPT) + generated])).logits[0].numpy()
    context, generation = outputs["context_logits"], outputs["generation_logits"]
    assert final and len(generated) == 4
    assert context.shape == (1, len(PROMPT), logits.shape[-1])
    np.testing.assert_allclose(context[0], logits[: len(PROMPT)], atol=1e-4)
    assert generation.shape == (1, 1, 4, logits.shape[-1])
    np.testing.assert_allclose(generation[0, 0], logits[len(PROMPT) - 1 : -1], atol=1e-4)


def test_streamed_generation_logits_come_one_chunk_at_a_time(sidecar: Sidecar) -> None:
    values = request(3, streaming=True, end_id=-1, return_generation_logits=True)
    chunks = [o["generation_logits"] for o, _ in Stream(sidecar, values).collect() if o]
    assert [chunk.shape[:3] for chunk in chunks if chunk.size] == [(1, 1, 1)] * 3


def test_streamed_log_probs_repeat_every_log_prob_so_far(sidecar: Sidecar) -> None:
    values = request(3, streaming=True, end_id=-1, return_log_probs=True)
    sizes = [o["output_log_probs"].size for o, _ in Stream(sidecar, values).collect() if o]
    assert sizes[:3] == [1, 2, 3]


def test_perf_metrics_on_request(sidecar: Sidecar) -> None:
    values = request(5, end_id=-1, exclude_input_in_output=True, return_perf_metrics=True)
    ((outputs, _),) = Stream(sidecar, values).collect()
    times = [
        int(outputs[name][0, 0])
        for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns")
    ] + [int(outputs["last_token_time_ns"][0, 0])]
    assert times == sorted(times) and times[0] > 1_600_000_000 * 10**9
    assert int(outputs["kv_cache_alloc_total_blocks"][0, 0]) == 1  # a 5-token prompt
    assert int(outputs["kv_cache_reused_blocks"][0, 0]) == 0
    assert "arrival_time_ns" not in Stream(sidecar, request(2)).collect()[0][0]


def test_engine_statistics_are_triton_metrics_named_as_the_cpp_backend_names_them(
    sidecar: Sidecar,
) -> None:
    import urllib.request

    def scrape() -> str:
        with urllib.request.urlopen(sidecar.metrics_url, timeout=10) as response:
            return response.read().decode()

    model = {"model": MODEL, "version": "1"}
    steps = "nv_trt_llm_general_metrics"
    before = value(scrape(), steps, general_type="iteration_counter", **model)
    Stream(sidecar, request(12, end_id=-1)).collect()
    time.sleep(0.5)
    text = scrape()
    after = value(text, steps, general_type="iteration_counter", **model)
    assert after >= before + 11
    assert value(text, "nv_trt_llm_request_metrics", request_type="max", **model) == 16
    blocks = "nv_trt_llm_kv_cache_block_metrics"
    assert value(text, blocks, kv_cache_block_type="tokens_per", **model) == 32
    lengths = "nv_llm_output_token_len_count"
    assert value(text, lengths, response_metric_type="total_output_tokens", **model) >= 1
