"""The load-test engine (benchmarks only, meaningless text): its spec and rendering, and the
pipeline over it in a real tritonserver, unpaced and paced."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from adapters.contract import GenerationRequest, ModelTarget, SamplingParams
from adapters.triton import TritonBackend
from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.render import RenderError, check_paths, render_config, render_model
from deploy.sidecar.spec import LoadTestEngine, SpecError, parse_spec
from deploy.sidecar.supervisor import Sidecar
from tests.benchmarks.relay import relay_process
from tests.support.engine_probe import EngineProcess
from tests.support.pipeline_calls import Stream, generate, texts
from tests.support.sidecars import QUICK_STOP

RELEASES = ("v0.8", "v0.11", "v0.19", "latest")
PROMPT = np.array([5, 7, 2, 9], np.int32)
ALL = frozenset(
    {
        "output_ids",
        "sequence_length",
        "cum_log_probs",
        "output_log_probs",
        "context_logits",
        "generation_logits",
        "batch_index",
        "sequence_index",
        "num_input_tokens",
        "num_output_tokens",
    }
)


def _lt_spec(tokenizer: str = "tiny", **engine: Any) -> dict[str, Any]:
    return {
        "models": [
            {
                "name": "lt",
                "release": "latest",
                "engine": {"kind": "loadtest", "tokenizer_dir": tokenizer, **engine},
            }
        ]
    }


def test_spec_defaults_the_tokenizer_to_the_engine(tmp_path: Path) -> None:
    model = parse_spec(_lt_spec("./tok", token_id=7), base_dir=tmp_path).models[0]
    assert model.engine == LoadTestEngine(tokenizer_dir=str(tmp_path / "tok"), token_id=7)
    assert (model.engine.token_s, model.engine.instances, model.engine.senders) == (0.0, 1, 4)
    assert model.tokenizer == str(tmp_path / "tok")
    with pytest.raises(SpecError, match="token_id"):
        parse_spec(_lt_spec(token_id=-1))
    with pytest.raises(RenderError, match=r"engine\.tokenizer_dir"):
        check_paths(model)


@pytest.mark.parametrize("release", RELEASES)
def test_renders_the_engine_model_with_the_load_test_parameters(release: str) -> None:
    data = _lt_spec(token_id=7, token_s=0.0125, prompt_token_s=0.0005, instances=4, senders=2)
    data["models"][0]["release"] = release
    model = parse_spec(data).models[0]
    config = render_config(model, "tensorrt_llm")
    assert 'backend: "python"' in config
    assert "torch_" not in config and "guided_decoding_backend" not in config
    assert '"loadtest_token_id"' in config and '"load_test_model"' in config
    assert re.search(r'"loadtest_token_s"\s*value:\s*\{\s*string_value:\s*"0.0125"', config)
    assert re.search(r"instance_group\s*\[\s*\{\s*count:\s*4\b", config)
    assert re.search(r'"loadtest_senders"\s*value:\s*\{\s*string_value:\s*"2"', config)
    model_py = render_model(model)["lt_tensorrt_llm/1/model.py"]
    assert "from deploy.triton.engine.triton_model import TritonPythonModel" in model_py
    check_paths(model)


@pytest.mark.parametrize(
    "engine",
    [{"token_s": -1.0}, {"prompt_token_s": -0.1}, {"instances": 0}, {"token_id": -1},
     {"senders": 0}],
)  # fmt: skip
def test_load_test_settings_out_of_range_are_refused(engine: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        parse_spec(_lt_spec(**engine))


@pytest.fixture(scope="module")
def lt_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    spec = parse_spec(
        {
            "models": [
                _lt_spec()["models"][0],
                {**_lt_spec(token_s=0.02, instances=2)["models"][0], "name": "paced"},
            ],
            "sidecars": [{"name": "main", **QUICK_STOP}],
        }
    )
    server = sidecar_from_spec(spec, spec.sidecars[0], tmp_path_factory.mktemp("loadtest"))
    server.start()
    yield server
    server.stop()


@pytest.mark.slow
def test_pipeline_over_the_load_test_model(lt_sidecar: Sidecar) -> None:
    prompt = "The quick brown fox jumps over the lazy dog."
    text_request = {"text_input": [[prompt]], "max_tokens": np.array([[16]], np.int32)}
    streamed = {**text_request, "stream": np.array([[True]])}
    for model in ("lt_ensemble", "lt_tensorrt_llm_bls"):
        chunks = texts(Stream(lt_sidecar, model, streamed, f"{model}-stream").collect())
        assert len(chunks) == 16, chunks
        assert "".join(chunks).strip()
    whole = generate(lt_sidecar, "lt_ensemble", {"text_input": prompt, "max_tokens": 16})
    assert whole["status"] == 200 and prompt in whole["text_output"], whole
    excluded = {"text_input": prompt, "max_tokens": 16, "exclude_input_in_output": True}
    assert generate(lt_sidecar, "lt_tensorrt_llm_bls", excluded)["text_output"].strip()

    direct = _streamed_request(16, end_id=np.array([[2]], np.int32))
    responses = _responses(Stream(lt_sidecar, "lt_tensorrt_llm", direct, "lt-direct"))
    tokens = [r["output_ids"].reshape(-1).tolist() for r in responses if "output_ids" in r]
    assert len(tokens) == 16 and all(len(t) == 1 for t in tokens)
    assert all(t != [2] for t in tokens)
    stop = {**direct, "stop": np.array([[True]])}
    stopper = Stream(lt_sidecar, "lt_tensorrt_llm", stop, "lt-direct")
    outputs, final = stopper.next()
    stopper.close()
    assert final and outputs == {}
    # Nothing of the pipeline over this engine loads torch: the tokenizer is read without
    # transformers, and numpy (< 2) carries the engine stub's tensors.
    for step in ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"):
        assert not EngineProcess(lt_sidecar, f"lt_{step}").maps_torch(), step


def _streamed_request(tokens: int, **more: np.ndarray) -> dict[str, np.ndarray]:
    """A streamed request of ``tokens`` to the engine itself for the prompt ids 5, 7, 2, 9."""
    return {
        "input_ids": np.array([[5, 7, 2, 9]], np.int32),
        "input_lengths": np.array([[4]], np.int32),
        "request_output_len": np.array([[tokens]], np.int32),
        "streaming": np.array([[True]]),
        **more,
    }


def _responses(stream: Stream) -> list[dict[str, Any]]:
    """The outputs of every response of a stream, read to its final one."""
    responses = []
    while True:
        outputs, final = stream.next()
        responses.append(outputs)
        if final:
            stream.close()
            return responses


def _streamed_ids(stream: Stream) -> list[int]:
    """Every output id of a stream's responses, in order."""
    ids = [r["output_ids"].reshape(-1).tolist() for r in _responses(stream) if "output_ids" in r]
    return [token for chunk in ids for token in chunk]


@pytest.mark.slow
def test_responses_of_concurrent_streams_keep_their_order_across_sender_threads(
    lt_sidecar: Sidecar,
) -> None:
    """The unpaced engine makes a stream's 48 tokens at once, so its 48 responses wait for the
    instance's four sender threads together: they go out in order, from one thread."""
    streams = []
    for index in range(8):
        prompt = [10 + index, 20 + index, 30 + index]
        request = {
            "input_ids": np.array([prompt], np.int32),
            "input_lengths": np.array([[3]], np.int32),
            "request_output_len": np.array([[48]], np.int32),
            "streaming": np.array([[True]]),
        }
        streams.append((prompt, Stream(lt_sidecar, "lt_tensorrt_llm", request, f"order-{index}")))
    for prompt, stream in streams:
        tokens = _streamed_ids(stream)
        assert tokens == (prompt * 16)[:48], tokens


@pytest.mark.slow
def test_a_paced_stream_gets_its_tokens_on_schedule(lt_sidecar: Sidecar) -> None:
    request = _streamed_request(10)
    start = time.monotonic()
    tokens = _streamed_ids(Stream(lt_sidecar, "paced_tensorrt_llm", request, "paced-1"))
    assert len(tokens) == 10
    assert time.monotonic() - start >= 9 * 0.02  # one token each 20 ms, never sooner


@pytest.mark.slow
def test_perf_metrics_come_on_a_streams_first_and_last_responses(lt_sidecar: Sidecar) -> None:
    """As from the torch engine: the times of the paced schedule, no KV blocks, only where the
    values are new (ten tensors on every token would weigh on the sending the engine measures)."""
    request = _streamed_request(6, return_perf_metrics=np.array([[True]]))
    responses = _responses(Stream(lt_sidecar, "paced_tensorrt_llm", request, "paced-perf"))
    carrying = [index for index, r in enumerate(responses) if "first_token_time_ns" in r]
    assert carrying == [0, len(responses) - 1], carrying
    first, last = responses[0], responses[-1]
    assert int(first["kv_cache_reused_blocks"].item()) == 0
    start = int(first["first_token_time_ns"].item())
    arrival = int(first["arrival_time_ns"].item())
    assert arrival <= start <= int(last["last_token_time_ns"].item())
    # The schedule is anchored where the request was admitted: a late first token is followed
    # by the next ones on time, so only the time since its arrival holds all five gaps.
    assert int(last["last_token_time_ns"].item()) - arrival >= 5 * 0.02 * 1e9 - 5e6


@pytest.mark.parametrize("transport", ["grpc", "http"])
@pytest.mark.slow
async def test_the_backend_passes_on_a_paced_streams_replies_as_they_come(
    lt_sidecar: Sidecar, transport: str
) -> None:
    """A reader that keeps up gets a chunk a reply: the HTTP transport joins only the replies
    that arrived while its reader was busy, and with one each 20 ms few wait at all (a loaded
    machine's reader may be late a few times; a transport that held them back would give one
    or two chunks)."""
    http = lt_sidecar.http_url if transport == "http" else None
    where = ModelTarget(url=lt_sidecar.grpc_url, triton_model="paced_ensemble",
                        kind="ensemble", http_url=http)  # fmt: skip
    request = GenerationRequest(
        request_id="paced", prompt="The quick brown fox",
        params=SamplingParams(max_tokens=20), stream=True, timeout_s=30.0,
    )  # fmt: skip
    async with TritonBackend() as backend:
        pieces = [chunk async for chunk in backend.generate(where, request)]
    carrying = [chunk for chunk in pieces if chunk.text]
    assert len(carrying) >= 4, pieces
    assert sum(chunk.token_count or 0 for chunk in pieces) == 20


@pytest.mark.parametrize("transport", ["grpc", "http"])
@pytest.mark.slow
async def test_the_replies_that_came_while_the_reader_was_busy_come_as_one_chunk(
    lt_sidecar: Sidecar, transport: str
) -> None:
    """A reader that fell behind (its client reads slowly) is handed the replies waiting in one
    chunk over either transport, rather than a chunk and a wake-up for each."""
    http = lt_sidecar.http_url if transport == "http" else None
    where = ModelTarget(url=lt_sidecar.grpc_url, triton_model="paced_ensemble",
                        kind="ensemble", http_url=http)  # fmt: skip
    request = GenerationRequest(
        request_id="behind", prompt="The quick brown fox",
        params=SamplingParams(max_tokens=30), stream=True, timeout_s=30.0,
    )  # fmt: skip
    async with TritonBackend() as backend:
        chunks = backend.generate(where, request)
        async with aclosing(chunks):
            first = await anext(chunks)
            # Busy for the time of 50 paced tokens: the stream's remaining 29 arrive meanwhile.
            await asyncio.sleep(1.0)
            rest = [chunk async for chunk in chunks]
    assert sum(chunk.token_count or 0 for chunk in [first, *rest]) == 30
    assert (rest[0].token_count or 0) > 1, rest


def _output_ids(answer: httpx.Response) -> list[list[int]]:
    assert answer.status_code == 200, answer.text
    events = [line.removeprefix("data: ") for line in answer.text.split("\n\n") if line]
    return [json.loads(event)["output_ids"] for event in events]


@pytest.mark.slow
def test_the_capacity_relay_passes_on_every_event_of_the_direct_request(
    lt_sidecar: Sidecar, tmp_path: Path
) -> None:
    """The relay, the capacity benchmark's floor of a Python hop, answers what Triton answers
    the direct request, request after request (each on a new connection, spread over its
    workers)."""
    body = {"input_ids": [5, 7, 2, 9], "input_lengths": [4], "request_output_len": [12],
            "streaming": [True]}  # fmt: skip
    path = "/v2/models/lt_tensorrt_llm/generate_stream"
    direct = _output_ids(httpx.post(f"{lt_sidecar.http_url}{path}", json=body, timeout=30))
    with relay_process(lt_sidecar, "lt_tensorrt_llm", body, tmp_path, workers=2) as (url, _):
        relayed = [_output_ids(httpx.post(url, content=b"{}", timeout=30)) for _ in range(6)]
    assert len(direct) == 12
    assert all(ids == direct for ids in relayed), relayed


@pytest.mark.slow
def test_an_engine_of_two_instances_publishes_metrics_and_stops_cleanly(tmp_path: Path) -> None:
    """Each instance registering the same metric families made Triton 2.51 abort at unload and
    wait out its exit timeout; one instance publishes them now."""
    spec = parse_spec({**_lt_spec(instances=2), "sidecars": [{"name": "two"}]})
    server = sidecar_from_spec(spec, spec.sidecars[0], tmp_path)
    server.start()
    try:
        metrics = httpx.get(server.metrics_url, timeout=10).text
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    assert 'nv_trt_llm_request_metrics{model="lt_tensorrt_llm"' in metrics
    assert "Signal (6)" not in log and "Exit timeout expired" not in log, log[-2000:]
