"""The serving process's tokenizer (``tokenizers`` + jinja2) against ``transformers`` itself:
the same chat prompts, ids, counts and decoded text, streamed or whole."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from gateway.catalog.text.hub import HubTokenizer, load_tokenizer
from gateway.catalog.text.prompts import PromptTokenizer
from gateway.catalog.text.template import pick_template
from gateway.errors import InvalidRequestError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city — «quoted»",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CONVERSATIONS: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = [
    ([{"role": "user", "content": "hello"}], None),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Ünïcödé <b>&</b> 😀"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "again"},
        ],
        None,
    ),
    (
        [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        TOOLS,
    ),
]
TEXTS = ["", "hello world", "  spaced  out ", "Ünïcödé 😀 <|im_end|> tail", "a\nb\n\nc"]


@pytest.fixture(scope="module")
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as pool:
        yield pool


def _parity(folder: Path, executor: ThreadPoolExecutor) -> None:
    reference = AutoTokenizer.from_pretrained(folder)
    ours = PromptTokenizer.load(str(folder), executor)
    hub = load_tokenizer(str(folder))
    assert isinstance(hub, HubTokenizer)
    assert len(hub) == len(reference)
    for messages, tools in CONVERSATIONS:
        try:
            expected = reference.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:
            with pytest.raises(InvalidRequestError, match=re.escape(str(exc)[:40])):
                ours._chat_prompt(messages, tools)
            continue
        prompt = ours._chat_prompt(messages, tools)
        assert prompt.text == expected
        assert list(prompt.ids) == reference.encode(expected)
    for text in TEXTS:
        for special in (True, False):
            assert hub.encode(text, add_special_tokens=special) == reference.encode(
                text, add_special_tokens=special
            )
        ids = reference.encode(text, add_special_tokens=False)
        for skip in (True, False):
            assert hub.decode(ids, skip_special_tokens=skip) == reference.decode(
                ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False
            )


def test_same_as_transformers_on_the_tiny_model(
    tiny_model_dir: Path, executor: ThreadPoolExecutor
) -> None:
    _parity(tiny_model_dir, executor)


@pytest.mark.smollm
def test_same_as_transformers_on_smollm2(executor: ThreadPoolExecutor) -> None:
    from deploy.sidecar.models import ensure_smollm2

    _parity(ensure_smollm2(), executor)


def test_streamed_text_equals_the_whole(tiny_model_dir: Path, executor: ThreadPoolExecutor) -> None:
    ours = PromptTokenizer.load(str(tiny_model_dir), executor)
    text = "Ünïcödé 😀 streams <|im_end|> whole, one token at a time"
    ids = list(ours._tokenizer.encode(text, add_special_tokens=False))
    for size in (1, 2, 5):
        stream = ours.text_stream()
        pieces = [stream.step(ids[i : i + size]) for i in range(0, len(ids), size)]
        pieces.append(stream.flush())
        assert "".join(pieces) == ours._tokenizer.decode(ids, skip_special_tokens=True)
        assert "<|im_end|>" not in "".join(pieces)


def test_stop_words_are_encoded_alone(tiny_model_dir: Path, executor: ThreadPoolExecutor) -> None:
    ours = PromptTokenizer.load(str(tiny_model_dir), executor)
    reference = AutoTokenizer.from_pretrained(tiny_model_dir)
    words = ["\n", "", "the end"]
    assert ours.word_ids(words) == [
        reference.encode("\n", add_special_tokens=False),
        reference.encode("the end", add_special_tokens=False),
    ]
    assert ours.end_id == reference.eos_token_id
    assert ours.pad_id == reference.pad_token_id


def test_named_templates_pick_tool_use_for_tools() -> None:
    templates = {"default": "d", "tool_use": "t"}
    assert pick_template(templates, tools=True) == "t"
    assert pick_template(templates, tools=False) == "d"
    assert pick_template("only", tools=True) == "only"


def test_serving_imports_neither_transformers_nor_torch(tiny_model_dir: Path) -> None:
    code = (
        "import sys\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "import gateway.app, gateway.cli\n"
        "from gateway.catalog.text.prompts import PromptTokenizer\n"
        f"t = PromptTokenizer.load({str(tiny_model_dir)!r}, ThreadPoolExecutor(1))\n"
        "t._chat_prompt([{'role': 'user', 'content': 'hi'}])\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_truncating_or_padding_tokenizer_file_encodes_whole_texts(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """transformers encodes the whole text, unpadded, whatever ``tokenizer.json`` sets."""
    import json
    import shutil

    folder = tmp_path / "truncating"
    shutil.copytree(tiny_model_dir, folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 3, "strategy": "LongestFirst",
                          "stride": 0}  # fmt: skip
    spec["padding"] = {"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": None,
                       "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"}  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    reference = AutoTokenizer.from_pretrained(folder)
    hub = load_tokenizer(str(folder))
    text = "a text of many more than three tokens, and fewer than sixty-four"
    for special in (True, False):
        ids = hub.encode(text, add_special_tokens=special)
        assert ids == reference.encode(text, add_special_tokens=special)
        assert 3 < len(ids) < 64
