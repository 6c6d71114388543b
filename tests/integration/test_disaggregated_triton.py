"""Disaggregated serving between two real tritonservers, each running the tiny model's torch
engine on the CPU: a context-only request on one, the generation-only request that continues it
on the other, the KV cache handed over between their processes."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from deploy.triton.engine.disagg.phase import ContextPhaseParams
from tests.support.engine_grpc import Stream, request, stop, tokens_of
from tests.support.prometheus import read_until, value
from tests.support.sidecars import QUICK_STOP

pytestmark = pytest.mark.slow

BLOCK = 16
LONG = "tiny_tensorrt_llm"
"""Holds a context-only request's blocks for a minute."""
QUICK = "quick_tensorrt_llm"
"""Holds them for three seconds."""
QUICK_TIMEOUT_MS = 3000
BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
DISAGG = "nv_trt_llm_disaggregated_serving_metrics"
PROMPT_TOKENS = 70
PROMPT_BLOCKS = -(-PROMPT_TOKENS // BLOCK)


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The context server (both models) and the generation server (``tiny`` only)."""
    engine = {
        "kind": "torch",
        "model_dir": str(tiny_model_dir),
        "max_batch_size": 4,
        "tokens_per_block": BLOCK,
        "guided_decoding": False,
    }
    spec = parse_spec(
        {
            "models": [
                {
                    "name": "tiny",
                    "release": "latest",
                    "engine": {**engine, "kv_transfer_timeout_ms": 60000},
                },
                {
                    "name": "quick",
                    "release": "latest",
                    "engine": {**engine, "kv_transfer_timeout_ms": QUICK_TIMEOUT_MS},
                },
            ],
            "sidecars": [
                {"name": "context", "keep_responses": False, **QUICK_STOP},
                {"name": "generation", "models": ["tiny"], "keep_responses": False, **QUICK_STOP},
            ],
        }
    )
    work = tmp_path_factory.mktemp("disagg")
    started = [sidecar_from_spec(spec, sidecar, work) for sidecar in spec.sidecars]
    try:
        for server in started:
            server.start()
        yield started
    finally:
        for server in started:
            server.stop()


def _prompt(seed: int) -> tuple[int, ...]:
    return tuple(int(t) for t in np.random.default_rng(seed).integers(100, 600, PROMPT_TOKENS))


def _run(
    server: Sidecar, values: dict[str, Any], model: str = LONG, request_type: str | None = None
) -> list[tuple[dict[str, Any], bool]]:
    parameters = None if request_type is None else {"request_type": request_type}
    return Stream(server, values, model=model, parameters=parameters).collect()


def _error(server: Sidecar, values: dict[str, Any], request_type: str, model: str = LONG) -> str:
    return Stream(server, values, model=model, parameters={"request_type": request_type}).error()


def _values(prompt: tuple[int, ...], **extra: Any) -> dict[str, Any]:
    return request(12, prompt, end_id=-1, exclude_input_in_output=True, **extra)


def _context(server: Sidecar, prompt: tuple[int, ...], model: str = LONG) -> tuple[int, bytes, Any]:
    """A context-only request: its first token, its ``context_phase_params`` and its outputs."""
    ((outputs, final),) = _run(
        server, _values(prompt, return_perf_metrics=True), model, "context_only"
    )
    assert final
    first = outputs["output_ids"].reshape(-1).tolist()
    assert len(first) == 1
    return first[0], outputs["context_phase_params"].reshape(-1).tobytes(), outputs


def _params_input(params: bytes) -> npt.NDArray[np.uint8]:
    return np.frombuffer(params, np.uint8).reshape(1, -1)


def _generation(server: Sidecar, prompt: tuple[int, ...], params: bytes, **extra: Any) -> Any:
    values = _values(prompt, return_perf_metrics=True, **extra)
    values["context_phase_params"] = _params_input(params)
    return _run(server, values, LONG, "generation_only")


def _scrape(server: Sidecar) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text: str = response.read().decode()
    return text


def _used_blocks(server: Sidecar, model: str) -> float:
    return value(_scrape(server), BLOCKS, model=model, kv_cache_block_type="used")


def _metric(outputs: dict[str, Any], name: str) -> float:
    return float(outputs[name].reshape(-1)[0])


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
def test_a_disaggregated_answer_equals_the_aggregated_one(servers: Any, streaming: bool) -> None:
    context, generation = servers
    prompt = _prompt(11 + streaming)
    whole = tokens_of(_run(context, _values(prompt)))
    assert len(whole) == 12
    first, params, context_outputs = _context(context, prompt)
    # The context engine prefilled only what it had not cached from the aggregated run.
    assert _metric(context_outputs, "kv_cache_reused_blocks") == (PROMPT_TOKENS - 1) // BLOCK
    responses = _generation(generation, prompt, params, streaming=streaming)
    tokens = tokens_of(responses)
    assert ([first, *tokens] if streaming else tokens) == whole
    final = responses[-1][0] if responses[-1][0] else responses[-2][0]
    # The generation engine took every block of the prompt and prefilled none of it.
    assert _metric(final, "kv_cache_transfer_blocks") == PROMPT_BLOCKS
    assert _metric(final, "kv_cache_reused_blocks") == 0
    assert _metric(final, "kv_cache_size") > 0
    assert _metric(final, "kv_cache_transfer_ms") > 0


def test_a_generation_engine_holding_the_prefix_takes_only_the_rest(servers: Any) -> None:
    context, generation = servers
    prompt = _prompt(21)
    whole = tokens_of(_run(generation, _values(prompt)))
    first, params, _ = _context(context, prompt)
    responses = _generation(generation, prompt, params)
    final = responses[-1][0]
    cached = PROMPT_TOKENS // BLOCK
    assert _metric(final, "kv_cache_reused_blocks") == cached
    assert _metric(final, "kv_cache_transfer_blocks") == PROMPT_BLOCKS - cached
    assert tokens_of(responses) == whole and whole[0] == first


def test_held_blocks_are_freed_once_taken(servers: Any) -> None:
    context, generation = servers
    read_until(lambda: _used_blocks(context, LONG), lambda used: used == 0)
    prompt = _prompt(31)
    _, params, _ = _context(context, prompt)
    read_until(lambda: _used_blocks(context, LONG), lambda used: used >= PROMPT_BLOCKS)
    _generation(generation, prompt, params)
    read_until(lambda: _used_blocks(context, LONG), lambda used: used == 0)
    again = _values(prompt)
    again["context_phase_params"] = _params_input(params)
    assert "taken already" in _error(generation, again, "generation_only")


def test_held_blocks_are_freed_after_the_timeout(servers: Any) -> None:
    context, generation = servers
    prompt = _prompt(41)
    _, params, _ = _context(context, prompt, QUICK)
    read_until(lambda: _used_blocks(context, QUICK), lambda used: used >= PROMPT_BLOCKS)
    read_until(lambda: _used_blocks(context, QUICK), lambda used: used == 0)
    late = _values(prompt)
    late["context_phase_params"] = _params_input(params)
    message = _error(generation, late, "generation_only")
    assert "freed after its kv_transfer_timeout_ms" in message


def test_bad_context_phase_params_and_request_types_are_refused(servers: Any) -> None:
    context, generation = servers
    prompt = _prompt(51)
    _, params, _ = _context(context, prompt)
    cases = {
        b"not ours": "not the output of a context_only request",
        params[:4] + bytes([9]) + params[5:]: "has version 9; this engine reads version 1",
    }
    for data, expected in cases.items():
        values = _values(prompt)
        values["context_phase_params"] = _params_input(data)
        assert expected in _error(generation, values, "generation_only")
    decoded = ContextPhaseParams.decode(params)
    unknown = ContextPhaseParams(**{**decoded.__dict__, "handoff_id": "0" * 32}).encode()
    values = _values(prompt)
    values["context_phase_params"] = _params_input(unknown)
    assert "holds no request" in _error(generation, values, "generation_only")
    shorter = _values(prompt[:-1])
    shorter["context_phase_params"] = _params_input(params)
    assert "a prompt of 70 tokens" in _error(generation, shorter, "generation_only")
    assert "needs the context_phase_params" in _error(
        generation, _values(prompt), "generation_only"
    )
    assert "answers once" in _error(context, _values(prompt, streaming=True), "context_only")
    assert "request_type must be one of" in _error(context, _values(prompt), "prefill")
    beams = _values(prompt, beam_width=2)
    assert "beam search" in _error(context, beams, "context_only")
    with_params = _values(prompt)
    with_params["context_phase_params"] = _params_input(params)
    assert (
        "read only by a generation_only request"
        in Stream(generation, with_params, model=LONG).error()
    )
    # None of the refused requests took the handoff, and its blocks are taken (freed) now.
    assert len(tokens_of(_generation(generation, prompt, params))) == 12


def test_the_disaggregated_serving_metrics_count_handoffs_on_both_sides(servers: Any) -> None:
    context, generation = servers
    prompt = _prompt(61)
    _, params, _ = _context(context, prompt)
    _generation(generation, prompt, params)
    for server in (context, generation):

        def handoffs(server: Sidecar = server) -> float:
            text = _scrape(server)
            return value(text, DISAGG, model=LONG, disaggregated_serving_type="request_count")

        assert read_until(handoffs, lambda count: count >= 1) >= 1
        text = _scrape(server)
        assert (
            value(text, DISAGG, model=LONG, disaggregated_serving_type="kv_cache_transfer_ms") > 0
        )


def test_a_stopped_generation_phase_frees_its_blocks_on_both_sides(servers: Any) -> None:
    context, generation = servers
    prompt = _prompt(71)
    _, params, _ = _context(context, prompt)
    values = request(2000, prompt, end_id=-1, streaming=True)
    values["context_phase_params"] = _params_input(params)
    stream = Stream(generation, values, model=LONG, parameters={"request_type": "generation_only"})
    streamed, _ = stream.next()
    assert streamed["output_ids"].size == 1
    stop(generation, stream.request_id, model=LONG)
    responses = stream.collect()
    assert responses[-1][1] and len(tokens_of(responses)) < 1999
    for server in (context, generation):

        def used(server: Sidecar = server) -> float:
            return _used_blocks(server, LONG)

        read_until(used, lambda blocks: blocks == 0)
