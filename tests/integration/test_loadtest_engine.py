"""The ZERO-COMPUTE load-test engine (benchmarks only, meaningless text): its pure helpers, its
rendering, and the pipeline over it in a real tritonserver."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.sidecar.render import RenderError, check_paths, render_config, render_model
from deploy.sidecar.spec import LoadTestEngine, SpecError, parse_spec
from deploy.sidecar.supervisor import Sidecar, sidecar_from_spec
from tests.support.pipeline_calls import Stream, generate, texts

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


@pytest.fixture(scope="module")
def lt() -> Iterator[types.ModuleType]:
    """``deploy.triton.loadtest.engine`` imported outside tritonserver (pb_utils stood in)."""
    with pytest.MonkeyPatch.context() as patch:
        stand_in = types.ModuleType("triton_python_backend_utils")
        patch.setitem(sys.modules, "triton_python_backend_utils", stand_in)
        sys.modules.pop("deploy.triton.loadtest.engine", None)
        yield importlib.import_module("deploy.triton.loadtest.engine")
        sys.modules.pop("deploy.triton.loadtest.engine", None)


def _inputs(**values: Any) -> dict[str, np.ndarray]:
    base: dict[str, Any] = {
        "input_ids": PROMPT[np.newaxis],
        "input_lengths": [[PROMPT.size]],
        "request_output_len": [[6]],
    }
    return {name: np.asarray(value) for name, value in (base | values).items()}


def test_fake_tokens_cycle_the_prompt_without_end_or_pad(lt: types.ModuleType) -> None:
    assert lt.fake_tokens(PROMPT, 6).tolist() == [5, 7, 2, 9, 5, 7]
    assert lt.fake_tokens(PROMPT, 5, end_id=2, pad_id=9).tolist() == [5, 7, 5, 7, 5]
    assert lt.fake_tokens(PROMPT, 3, token_id=11, end_id=2).tolist() == [11, 11, 11]
    assert lt.fake_tokens(PROMPT, 2, token_id=2, end_id=2).tolist() == [5, 7]
    assert lt.fake_tokens(np.array([0, 0]), 3, end_id=0, pad_id=1).tolist() == [2, 2, 2]
    assert lt.fake_tokens(PROMPT, 4).dtype == np.int32


def test_read_items_checks_as_the_torch_engine(lt: types.ModuleType) -> None:
    (item,) = lt.read_items(_inputs(input_lengths=[[3]], end_id=[[2]], streaming=[[True]]))
    assert item.prompt.tolist() == [5, 7, 2] and item.output_len == 6
    assert item.streaming and item.end_id == 2 and not item.exclude_input
    assert lt.read_items(_inputs(), exclude_input_default=True)[0].exclude_input
    assert not lt.read_items(
        _inputs(exclude_input_in_output=[[False]]), exclude_input_default=True
    )[0].exclude_input
    two = lt.read_items(_inputs(input_ids=[[1, 2], [3, 4]], input_lengths=[[2], [1]]))
    assert [(i.batch_index, i.batch_size, i.prompt.tolist()) for i in two] == [
        (0, 2, [1, 2]),
        (1, 2, [3]),
    ]
    for bad, message in [
        (_inputs(input_lengths=[[0]]), "input_ids is empty"),
        (_inputs(input_lengths=[[9]]), "does not fit"),
        (_inputs(request_output_len=[[0]]), "at least 1"),
        (_inputs(return_generation_logits=[[True]]), "no logits"),
    ]:
        with pytest.raises(lt.LoadTestError, match=message):
            lt.read_items(bad)
    assert lt.is_stop_request(_inputs(stop=[[True]]))
    assert not lt.is_stop_request(_inputs())


def test_only_decoupled_streams_batches_and_sequences(lt: types.ModuleType) -> None:
    for values, message in [
        ({"streaming": [[True]]}, "Streaming is only supported"),
        ({"input_ids": [[1], [2]], "input_lengths": [[1], [1]]}, "Batch size > 1"),
        ({"num_return_sequences": [[2]]}, "num_return_sequences > 1"),
    ]:
        items = lt.read_items(_inputs(**values))
        lt.check_policy(items, decoupled=True)
        with pytest.raises(lt.LoadTestError, match=message):
            lt.check_policy(items, decoupled=False)


def test_streaming_sends_one_token_per_response(lt: types.ModuleType) -> None:
    (item,) = lt.read_items(
        _inputs(streaming=[[True]], return_num_output_tokens=[[True]], return_log_probs=[[True]])
    )
    responses = lt.item_outputs(item, ALL)
    assert len(responses) == 6
    for count, outputs in enumerate(responses, start=1):
        assert outputs["output_ids"].shape == (1, 1, 1)
        assert outputs["sequence_length"].tolist() == [[1]]
        assert outputs["num_output_tokens"].tolist() == [[1]]
        assert outputs["output_log_probs"].shape == (1, 1, count)
        assert set(outputs) == {
            "output_ids",
            "sequence_length",
            "num_output_tokens",
            "cum_log_probs",
            "output_log_probs",
        }
    assert [int(r["output_ids"][0, 0, 0]) for r in responses] == [5, 7, 2, 9, 5, 7]
    first = lt.item_outputs(item, {"output_ids"}, token_id=3)[0]
    assert list(first) == ["output_ids"] and first["output_ids"].tolist() == [[[3]]]


def test_whole_responses_carry_the_prompt_unless_excluded(lt: types.ModuleType) -> None:
    (item,) = lt.read_items(_inputs(return_num_input_tokens=[[True]], end_id=[[9]]))
    (outputs,) = lt.item_outputs(item, ALL)
    assert outputs["output_ids"].tolist() == [[[5, 7, 2, 9, 5, 7, 2, 5, 7, 2]]]
    assert outputs["sequence_length"].tolist() == [[10]]
    assert outputs["num_input_tokens"].tolist() == [[4]]
    assert outputs["output_ids"].dtype == np.int32
    (item,) = lt.read_items(_inputs(exclude_input_in_output=[[True]], num_return_sequences=[[2]]))
    first, second = lt.item_outputs(item, ALL)
    assert first["output_ids"].shape == (1, 1, 6)
    assert (first["sequence_index"].item(), second["sequence_index"].item()) == (0, 1)
    assert "cum_log_probs" not in first and "batch_index" not in first
    (old,) = lt.item_outputs(item, ALL - {"sequence_index"}, placeholders=True)[:1]
    assert old["output_log_probs"].shape == (1, 1, 4)
    assert old["generation_logits"].shape == (1, 1, 1, 1)


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
    assert model.tokenizer == str(tmp_path / "tok")
    with pytest.raises(SpecError, match="token_id"):
        parse_spec(_lt_spec(token_id=-1))
    with pytest.raises(RenderError, match=r"engine\.tokenizer_dir"):
        check_paths(model)


@pytest.mark.parametrize("release", RELEASES)
def test_renders_a_python_model_importing_deploy_loadtest(release: str) -> None:
    data = _lt_spec(token_id=7)
    data["models"][0]["release"] = release
    model = parse_spec(data).models[0]
    config = render_config(model, "tensorrt_llm")
    assert 'backend: "python"' in config
    assert "torch_" not in config and "guided_decoding_backend" not in config
    assert '"loadtest_token_id"' in config and '"load_test_model"' in config
    model_py = render_model(model)["lt_tensorrt_llm/1/model.py"]
    assert "from deploy.triton.loadtest.engine import TritonPythonModel" in model_py
    assert "torch" not in model_py
    check_paths(model)


@pytest.fixture(scope="module")
def lt_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    spec = parse_spec(_lt_spec())
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

    direct = {
        "input_ids": np.array([[5, 7, 2, 9]], np.int32),
        "input_lengths": np.array([[4]], np.int32),
        "request_output_len": np.array([[16]], np.int32),
        "end_id": np.array([[2]], np.int32),
        "streaming": np.array([[True]]),
    }
    stream = Stream(lt_sidecar, "lt_tensorrt_llm", direct, "lt-direct")
    responses = []
    while True:
        outputs, final = stream.next()
        responses.append(outputs)
        if final:
            break
    stream.close()
    tokens = [r["output_ids"].reshape(-1).tolist() for r in responses if "output_ids" in r]
    assert len(tokens) == 16 and all(len(t) == 1 for t in tokens)
    assert all(t != [2] for t in tokens)
    stop = {**direct, "stop": np.array([[True]])}
    stopper = Stream(lt_sidecar, "lt_tensorrt_llm", stop, "lt-direct")
    outputs, final = stopper.next()
    stopper.close()
    assert final and outputs == {}
