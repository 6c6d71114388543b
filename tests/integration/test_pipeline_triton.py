"""The pipeline models inside a real tritonserver: ensemble and BLS, streaming and not."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from deploy.sidecar.supervisor import Sidecar
from tests.support.pipeline_calls import Stream, generate, generate_stream, inputs_of, texts
from tests.support.sidecars import QUICK_STOP

pytestmark = pytest.mark.slow

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
MULTIBYTE = "héllo 世界 🎉 naïve"


def _request(max_tokens: int = 24, **extra: Any) -> dict[str, Any]:
    return {
        "text_input": [[PROMPT]],
        "max_tokens": np.array([[max_tokens]], np.int32),
        "exclude_input_in_output": np.array([[True]]),
        **extra,
    }


@pytest.fixture(scope="module")
def reference(sidecar: Sidecar) -> str:
    """The non-streamed completion of PROMPT, through the ensemble."""
    body = {"text_input": PROMPT, "max_tokens": 24, "exclude_input_in_output": True}
    result = generate(sidecar, "tiny_ensemble", body)
    assert result["status"] == 200, result
    text = str(result["text_output"])
    assert len(text) > 20
    return text


@pytest.mark.parametrize("model", ["tiny_tensorrt_llm_bls", "tiny2_tensorrt_llm_bls"])
def test_bls_non_streamed_text_matches_the_ensemble(
    sidecar: Sidecar, reference: str, model: str
) -> None:
    body = {"text_input": PROMPT, "max_tokens": 24, "exclude_input_in_output": True}
    assert generate(sidecar, model, body)["text_output"] == reference


@pytest.mark.parametrize("model", ["tiny_ensemble", "tiny_tensorrt_llm_bls"])
def test_grpc_streamed_deltas_concatenate_to_the_text(
    sidecar: Sidecar, reference: str, model: str
) -> None:
    values = _request(stream=np.array([[True]]))
    chunks = Stream(sidecar, model, values, f"grpc-{uuid.uuid4().hex}").collect()
    deltas = texts(chunks)
    assert len(deltas) >= 20
    assert "".join(deltas) == reference


@pytest.mark.parametrize("model", ["tiny_ensemble", "tiny_tensorrt_llm_bls"])
def test_http_streamed_deltas_concatenate_to_the_text(
    sidecar: Sidecar, reference: str, model: str
) -> None:
    body = {
        "id": f"http-{uuid.uuid4().hex}",
        "text_input": PROMPT,
        "max_tokens": 24,
        "exclude_input_in_output": True,
        "stream": True,
    }
    events = generate_stream(sidecar, model, body)
    assert "".join(str(e.get("text_output", "")) for e in events) == reference


def test_accumulating_bls_streams_the_text_so_far(sidecar: Sidecar, reference: str) -> None:
    values = _request(stream=np.array([[True]]))
    outputs = texts(Stream(sidecar, "tiny2_tensorrt_llm_bls", values, "acc").collect())
    assert outputs[-1] == reference
    assert all(b.startswith(a) for a, b in itertools.pairwise(outputs))


def _postprocess(server: Sidecar, ids: list[int], request_id: str) -> str:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    values = {
        "TOKENS_BATCH": np.array([[ids or [0]]], np.int32),
        "SEQUENCE_LENGTH": np.array([[len(ids)]], np.int32),
    }
    result = client.infer("tiny_postprocessing", inputs_of(values), request_id=request_id)
    client.close()
    return bytes(result.as_numpy("OUTPUT").reshape(-1)[0]).decode()


def test_postprocessing_streams_exact_deltas_per_request_id(
    sidecar: Sidecar, tiny_model_dir: Path
) -> None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model_dir).encode(MULTIBYTE, add_special_tokens=False)
    assert len(ids) > len(MULTIBYTE.split()), "some characters must span several tokens"
    request_id = f"post-{uuid.uuid4().hex}"
    deltas = [_postprocess(sidecar, [token], request_id) for token in ids]
    assert "".join(deltas) == MULTIBYTE
    assert all("\ufffd" not in delta for delta in deltas)
    assert "" in deltas, "an incomplete character must be held back"
    assert _postprocess(sidecar, ids, "") == MULTIBYTE
    assert "\ufffd" in "".join(_postprocess(sidecar, [token], "") for token in ids)


def test_preprocessing_returns_only_requested_outputs(sidecar: Sidecar) -> None:
    client = grpcclient.InferenceServerClient(sidecar.grpc_url)
    values = {
        "QUERY": [["Hello world"], ["Hi"]],
        "REQUEST_OUTPUT_LEN": np.array([[4], [4]], np.int32),
        "STOP_WORDS_DICT": [["Paris", ""], ["", ""]],
    }
    wanted = ["INPUT_ID", "REQUEST_INPUT_LEN", "STOP_WORDS_IDS", "OUT_END_ID"]
    outputs = [grpcclient.InferRequestedOutput(name) for name in wanted]
    result = client.infer("tiny_preprocessing", inputs_of(values), outputs=outputs)
    client.close()
    response = result.get_response()
    assert sorted(out.name for out in response.outputs) == sorted(wanted)
    lengths = result.as_numpy("REQUEST_INPUT_LEN")
    assert lengths.shape == (2, 1) and lengths[0, 0] > lengths[1, 0]
    stop = result.as_numpy("STOP_WORDS_IDS")
    assert stop.shape[:2] == (2, 2)
    assert stop[1, 1].tolist() == [-1] * stop.shape[2]


@pytest.mark.parametrize("model", ["tiny_tensorrt_llm_bls", "tiny2_tensorrt_llm_bls"])
def test_bls_stop_words_truncate_after_the_word(
    sidecar: Sidecar, reference: str, model: str
) -> None:
    stop = reference[6:10]
    expected = reference[: reference.index(stop) + len(stop)]
    body = {"text_input": PROMPT, "max_tokens": 24, "exclude_input_in_output": True}
    assert generate(sidecar, model, {**body, "stop_words": [stop]})["text_output"] == expected
    values = _request(stream=np.array([[True]]), stop_words=[[stop]])
    streamed = texts(Stream(sidecar, model, values, f"stop-{uuid.uuid4().hex}").collect())
    final = streamed[-1] if model.startswith("tiny2") else "".join(streamed)
    assert final == expected


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"text_input": "hi", "max_tokens": 0}, "max_tokens must be a single value > 0"),
        ({"text_input": "hi", "max_tokens": 4, "num_draft_tokens": 2}, "speculative decoding"),
        ({"text_input": "hi " * 5000, "max_tokens": 4}, "tiny_tensorrt_llm: "),
    ],
)
def test_bls_errors_are_clear(sidecar: Sidecar, body: dict[str, Any], message: str) -> None:
    result = generate(sidecar, "tiny_tensorrt_llm_bls", body)
    assert result["status"] >= 400
    assert message in result["error"]


def test_bls_forwards_num_return_sequences(sidecar: Sidecar) -> None:
    values = _request(
        max_tokens=6,
        num_return_sequences=np.array([[2]], np.int32),
        temperature=np.array([[1.0]], np.float32),
        top_k=np.array([[50]], np.int32),
        seed=np.array([[3]], np.uint64),
    )
    chunks = Stream(sidecar, "tiny_tensorrt_llm_bls", values, f"n-{uuid.uuid4().hex}").collect()
    assert sorted(int(c["sequence_index"].reshape(-1)[0]) for c in chunks) == [0, 1]


def _cpu_ticks(server: Sidecar, model: str) -> int:
    marker = f"{server.repository}/{model}/1/model.py"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if marker in cmdline:
            return int(fields[11]) + int(fields[12])
    raise AssertionError(f"no stub process runs {marker}")


def _busy_ticks(server: Sidecar, model: str, seconds: float = 1.0) -> int:
    before = _cpu_ticks(server, model)
    time.sleep(seconds)
    return _cpu_ticks(server, model) - before


def test_bls_serves_others_while_streaming_and_cancellation_stops_the_engine(
    sidecar: Sidecar,
) -> None:
    long = Stream(
        sidecar,
        "tiny_tensorrt_llm_bls",
        _request(max_tokens=3000, stream=np.array([[True]])),
        f"long-{uuid.uuid4().hex}",
    )
    for _ in range(3):
        long.next()
    started = time.monotonic()
    short = generate(sidecar, "tiny_tensorrt_llm_bls", {"text_input": "Hi", "max_tokens": 4})
    assert short["status"] == 200 and short["text_output"]
    assert time.monotonic() - started < 30
    assert long.next()[1] is False, "the long stream is still going"
    busy = _busy_ticks(sidecar, "tiny_tensorrt_llm")
    long.close(cancel=True)
    time.sleep(1.0)
    idle = _busy_ticks(sidecar, "tiny_tensorrt_llm")
    assert busy >= 20, "the engine should be working on the long request"
    assert idle <= max(5, busy // 5), (busy, idle)
    follow_up = generate(sidecar, "tiny_tensorrt_llm_bls", {"text_input": "Hi", "max_tokens": 4})
    assert follow_up["text_output"] == short["text_output"]


def test_bls_counts_tokens_when_the_config_declares_them(sidecar: Sidecar) -> None:
    config = json.loads(
        urllib.request.urlopen(
            f"{sidecar.http_url}/v2/models/tiny_tensorrt_llm_bls/config", timeout=30
        ).read()
    )
    if "num_output_tokens" not in {o["name"] for o in config["output"]}:
        pytest.skip("this config version has no num_input_tokens / num_output_tokens")
    counts = {
        "return_num_input_tokens": np.array([[True]]),
        "return_num_output_tokens": np.array([[True]]),
    }
    values = _request(max_tokens=10, stream=np.array([[True]]), **counts)
    chunks = Stream(sidecar, "tiny_tensorrt_llm_bls", values, "count").collect()
    assert sum(int(c["num_output_tokens"].sum()) for c in chunks if "num_output_tokens" in c) == 10


def test_concurrent_streams_each_get_their_own_text(sidecar: Sidecar, reference: str) -> None:
    results: dict[int, str] = {}

    def run(index: int) -> None:
        values = _request(stream=np.array([[True]]))
        chunks = Stream(sidecar, "tiny_ensemble", values, f"c{index}-{uuid.uuid4().hex}").collect()
        results[index] = "".join(texts(chunks))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results == {i: reference for i in range(4)}


@pytest.fixture(scope="module")
def smollm_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A sidecar serving SmolLM2-135M-Instruct (converted from the PyPI GGUF) as ``smol``."""
    from deploy.sidecar.fleet import sidecar_from_spec
    from deploy.sidecar.models import ensure_smollm2
    from deploy.sidecar.spec import parse_spec

    try:
        model_dir = str(ensure_smollm2())
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    engine = {"kind": "torch", "model_dir": model_dir, "max_batch_size": 4}
    spec = parse_spec(
        {
            "models": [{"name": "smol", "engine": engine}],
            "sidecars": [{"name": "smol", **QUICK_STOP}],
        }
    )
    server = sidecar_from_spec(spec, spec.sidecars[0], tmp_path_factory.mktemp("smol"))
    server.start()
    yield server
    server.stop()


def _smol_prompt(question: str) -> str:
    return (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        f"Face<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.smollm
def test_smollm2_multibyte_text_streams_exactly(smollm_sidecar: Sidecar) -> None:
    """Japanese output spans several tokens per character and is cut mid-character at the end."""
    prompt = _smol_prompt("How do you say hello in Japanese and Chinese?")
    values = {
        "text_input": [[prompt]],
        "max_tokens": np.array([[40]], np.int32),
        "exclude_input_in_output": np.array([[True]]),
    }
    body = {"text_input": prompt, "max_tokens": 40, "exclude_input_in_output": True}
    reference = generate(smollm_sidecar, "smol_ensemble", body)
    text = str(reference["text_output"])
    assert any(ord(ch) > 0x3000 for ch in text), text
    stream = {**values, "stream": np.array([[True]])}
    bls = texts(Stream(smollm_sidecar, "smol_tensorrt_llm_bls", stream, "smol-bls").collect())
    assert "".join(bls) == text
    ensemble = texts(Stream(smollm_sidecar, "smol_ensemble", stream, "smol-ens").collect())
    # The ensemble cannot tell the last chunk, so an incomplete final character stays held back.
    assert "".join(ensemble) == text.removesuffix("\ufffd")
    assert all("\ufffd" not in delta for delta in ensemble)


@pytest.mark.smollm
def test_smollm2_answers_through_the_bls(smollm_sidecar: Sidecar) -> None:
    prompt = _smol_prompt("What is the capital of France?")
    body = {"text_input": prompt, "max_tokens": 12, "exclude_input_in_output": True}
    assert "Paris" in generate(smollm_sidecar, "smol_tensorrt_llm_bls", body)["text_output"]
