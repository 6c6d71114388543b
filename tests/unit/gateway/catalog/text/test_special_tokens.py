"""Generated text decoded as the model's formats need: the special tokens they read kept (gpt-oss's
channels, DeepSeek's and Kimi's call markers), every other special token (end of turn) left out,
and an explicit ``skip_special_tokens: true`` that would drop the formats' markers refused at
start-up. Tokenizer folders are the tiny model's with the families' special tokens added."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from deploy.sidecar.spec import parse_spec
from gateway.catalog.registry import resolve_routes
from gateway.catalog.text.decoding import decoding
from gateway.catalog.text.prompts import PromptTokenizer
from gateway.settings import SettingsError, parse_settings
from gateway.tools import Folded
from gateway.tools.formats import tool_format
from gateway.tools.formats.deepseek_v3 import CALL, SECTION, SEP
from gateway.tools.reasoning.harmony import SPECIAL_TOKENS as HARMONY

GPT_OSS_TEMPLATE = "{% for m in messages %}<|start|>{{ m.role }}<|channel|>analysis{% endfor %}"
DEEPSEEK_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}<｜tool▁calls▁begin｜>"
GPT_OSS_END = "<|endoftext|>"
DEEPSEEK_END = "<｜end▁of▁sentence｜>"
HARMONY_ANSWER = (
    "<|channel|>analysis<|message|>The user wants Tokyo's weather.<|end|><|start|>assistant"
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": '
    '"Tokyo"}<|call|>'
)
DEEPSEEK_ANSWER = (
    f'Let me check.{SECTION[0]}{CALL[0]}get_weather{SEP}{{"city": "Tokyo"}}{CALL[1]}{SECTION[1]}'
)


@pytest.fixture(scope="module")
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as pool:
        yield pool


def family_tokenizer(model_dir: Path, out: Path, special: list[str], template: str) -> Path:
    """The tiny tokenizer with ``special`` added as special tokens, and ``template``."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": special})
    tokenizer.chat_template = template
    tokenizer.save_pretrained(out)
    return out


def streamed(tokenizer: PromptTokenizer, text: str, size: int) -> str:
    ids = tokenizer._tokenizer.encode(text, add_special_tokens=False)
    stream = tokenizer.text_stream()
    pieces = [stream.step(ids[start : start + size]) for start in range(0, len(ids), size)]
    return "".join(pieces) + stream.flush()


@pytest.fixture(scope="module")
def gpt_oss_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpt-oss")
    return family_tokenizer(tiny_model_dir, out, [*HARMONY, GPT_OSS_END], GPT_OSS_TEMPLATE)


@pytest.fixture(scope="module")
def deepseek_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("deepseek")
    markers = [*SECTION, *CALL, SEP, DEEPSEEK_END]
    return family_tokenizer(tiny_model_dir, out, markers, DEEPSEEK_TEMPLATE)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_harmony_keeps_its_channels_and_drops_the_end_of_text(
    gpt_oss_dir: Path, executor: ThreadPoolExecutor, size: int
) -> None:
    loaded = PromptTokenizer.load(str(gpt_oss_dir), executor)
    tokenizer = decoding(loaded, "gpt-oss", None, None, None)
    assert set(tokenizer.kept_special_tokens) == set(HARMONY)
    # Skipping every special token, as before, runs the channels into one text.
    assert streamed(loaded, HARMONY_ANSWER, size) == (
        "analysisThe user wants Tokyo's weather.assistantcommentary to=functions.get_weather "
        'json{"city": "Tokyo"}'
    )
    text = streamed(tokenizer, HARMONY_ANSWER + GPT_OSS_END, size)
    assert text == HARMONY_ANSWER
    folded = Folded()
    parser = tool_format("harmony").parser()
    folded.add(parser.feed(text))
    folded.add(parser.finish())
    assert folded.reasoning == "The user wants Tokyo's weather."
    assert [(c.name, c.arguments) for c in folded.calls] == [("get_weather", '{"city": "Tokyo"}')]
    assert folded.content == ""


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_deepseek_keeps_its_call_markers_and_drops_the_end_of_sentence(
    deepseek_dir: Path, executor: ThreadPoolExecutor, size: int
) -> None:
    loaded = PromptTokenizer.load(str(deepseek_dir), executor)
    tokenizer = decoding(loaded, "deepseek", None, "deepseek_v3", None)
    assert streamed(tokenizer, DEEPSEEK_ANSWER + DEEPSEEK_END, size) == DEEPSEEK_ANSWER


def test_an_explicit_false_keeps_every_special_token(
    gpt_oss_dir: Path, executor: ThreadPoolExecutor
) -> None:
    loaded = PromptTokenizer.load(str(gpt_oss_dir), executor, skip_special_tokens=False)
    tokenizer = decoding(loaded, "gpt-oss", False, None, None)
    assert streamed(tokenizer, HARMONY_ANSWER + GPT_OSS_END, 3) == HARMONY_ANSWER + GPT_OSS_END


def test_an_explicit_true_that_drops_the_formats_markers_is_refused(
    gpt_oss_dir: Path, deepseek_dir: Path, executor: ThreadPoolExecutor
) -> None:
    loaded = PromptTokenizer.load(str(gpt_oss_dir), executor)
    with pytest.raises(SettingsError) as raised:
        decoding(loaded, "gpt-oss", True, None, None)
    message = str(raised.value)
    assert "'gpt-oss'" in message and "skip_special_tokens is true" in message
    assert "tool_call_format 'harmony'" in message and "reasoning_parser 'harmony'" in message
    assert "<|channel|>" in message
    loaded = PromptTokenizer.load(str(deepseek_dir), executor)
    with pytest.raises(SettingsError, match="tool_call_format 'deepseek_v3'"):
        decoding(loaded, "deepseek", True, "deepseek_v3", None)


def test_markers_that_are_not_special_tokens_need_nothing(
    tiny_model_dir: Path, executor: ThreadPoolExecutor
) -> None:
    """The tiny tokenizer writes ``<think>`` and Hermes' ``<tool_call>`` as text: an explicit
    true is no conflict, and unset keeps nothing beyond what skipping keeps."""
    loaded = PromptTokenizer.load(str(tiny_model_dir), executor)
    assert decoding(loaded, "tiny", True, "hermes", "think") is loaded
    assert decoding(loaded, "tiny", None, "hermes", "think") is loaded


def test_a_pipeline_postprocessing_that_drops_the_formats_markers_is_refused(
    gpt_oss_dir: Path, tiny_model_dir: Path, executor: ThreadPoolExecutor
) -> None:
    """An ensemble's text is decoded by its pipeline's postprocessing, which the gateway cannot
    make keep some special tokens: one that drops them all is refused at start-up."""
    loaded = PromptTokenizer.load(str(gpt_oss_dir), executor)
    with pytest.raises(SettingsError, match="postprocessing of pipeline 'oss'") as raised:
        decoding(loaded, "gpt-oss", None, None, None, postprocessing="oss")
    assert "skip_special_tokens false" in str(raised.value)
    tiny = PromptTokenizer.load(str(tiny_model_dir), executor)
    assert decoding(tiny, "tiny", None, None, None, postprocessing="tiny") is tiny


@pytest.mark.parametrize(
    ("model", "pipeline_skips", "skip", "postprocessing"),
    [
        # Unset: what the formats need, decoded by the gateway or by the pipeline's models.
        ({"entry": "tensorrt_llm"}, True, None, None),
        ({"entry": "ensemble"}, True, None, "tiny"),
        ({"entry": "tensorrt_llm_bls"}, True, None, "tiny"),
        # A pipeline whose postprocessing keeps special tokens keeps them all.
        ({"entry": "tensorrt_llm"}, False, False, None),
        ({"entry": "ensemble"}, False, False, None),
        # An explicit value wins.
        ({"entry": "tensorrt_llm", "skip_special_tokens": True}, True, True, None),
        ({"entry": "tensorrt_llm", "skip_special_tokens": False}, True, False, None),
    ],
)
def test_a_routes_decoding_settings(
    model: dict[str, Any], pipeline_skips: bool, skip: bool | None, postprocessing: str | None
) -> None:
    engine = {"kind": "torch", "model_dir": "/m/tiny"}
    spec = parse_spec(
        {
            "models": [{"name": "tiny", "engine": engine, "skip_special_tokens": pipeline_skips}],
            "sidecars": [{"name": "a"}],
        }
    )
    settings = parse_settings(
        {"models": [{"name": "m", "pipeline": "tiny", **model}], "tenancy": {"auth": False}}
    )
    (route,) = resolve_routes(settings, spec, {"tiny": "127.0.0.1:1"}, {}, None, ())
    assert (route.skip_special_tokens, route.postprocessing) == (skip, postprocessing)
