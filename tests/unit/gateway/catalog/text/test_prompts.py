"""Templating and counting with a real tokenizer: no double BOS, counts as the engine sees them,
and the same prompts, ids and text as ``transformers`` (which the serving process never imports)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tokenizers.processors import TemplateProcessing
from transformers import AutoTokenizer

from gateway.catalog.text.prompts import INLINE_CHARS, PromptTokenizer, strip_leading_bos
from gateway.errors import InvalidRequestError

BOS = "<|endoftext|>"
BOS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATION = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as pool:
        yield pool


def llama_like(model_dir: Path, out: Path) -> Any:
    """The tiny tokenizer made to add a BOS, with a template that writes one too, saved in
    ``out``."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.bos_token = BOS
    bos_id = tokenizer.convert_tokens_to_ids(BOS)
    tokenizer._tokenizer.post_processor = TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)]
    )
    tokenizer.chat_template = BOS_TEMPLATE
    tokenizer.save_pretrained(out)
    return tokenizer


@pytest.mark.parametrize(
    ("text", "bos", "expected"),
    [("<s>hi", "<s>", "hi"), ("hi", "<s>", "hi"), ("<s><s>hi", "<s>", "<s>hi"), ("hi", None, "hi")],
)
def test_strip_leading_bos(text: str, bos: str | None, expected: str) -> None:
    assert strip_leading_bos(text, bos) == expected


@pytest.mark.parametrize("preprocessing_adds_bos", [True, False])
async def test_no_double_bos(
    tiny_model_dir: Path, executor: ThreadPoolExecutor, preprocessing_adds_bos: bool, tmp_path: Path
) -> None:
    tokenizer = llama_like(tiny_model_dir, tmp_path)
    prompt = await PromptTokenizer.load(
        str(tmp_path), executor, add_special_tokens=preprocessing_adds_bos
    ).chat_prompt(CONVERSATION)
    assert prompt.text.endswith("<|im_start|>assistant\n")
    assert prompt.text.startswith(BOS) is not preprocessing_adds_bos
    ids = tokenizer.encode(prompt.text, add_special_tokens=preprocessing_adds_bos)
    assert ids.count(tokenizer.bos_token_id) == 1  # what the engine will see
    assert prompt.token_count == len(ids)
    assert list(prompt.ids) == ids


@pytest.mark.parametrize("preprocessing_adds_bos", [True, False])
async def test_exact_counts_are_what_the_preprocessing_makes_of_the_text(
    tiny_model_dir: Path, executor: ThreadPoolExecutor, tmp_path: Path, preprocessing_adds_bos: bool
) -> None:
    """The count the gateway sends instead of asking the engine for ``num_input_tokens``: that
    of the text as the preprocessing tokenizes it (an empty prompt included)."""
    tokenizer = llama_like(tiny_model_dir, tmp_path)
    prompts = PromptTokenizer.load(
        str(tmp_path), executor, add_special_tokens=preprocessing_adds_bos
    )
    for prompt in (
        await prompts.chat_prompt(CONVERSATION),
        await prompts.text_prompt("the model token"),
        await prompts.text_prompt(""),
    ):
        preprocessed = tokenizer.encode(prompt.text, add_special_tokens=preprocessing_adds_bos)
        assert prompt.exact_count == len(preprocessed) > 0


async def test_chat_template_file_overrides_the_tokenizer(
    tiny_model_dir: Path, executor: ThreadPoolExecutor, tmp_path: Path
) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text(
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] "
    )
    tokenizer = PromptTokenizer.load(
        str(tiny_model_dir), executor, chat_template_file=str(template)
    )
    prompt = await tokenizer.chat_prompt([{"role": "system", "content": "s"}, *CONVERSATION])
    assert prompt.text == "[system] s\n[user] hello\n[assistant] "


async def test_named_templates_serve_the_requests_they_are_for_whichever_came_first(
    tiny_model_dir: Path, executor: ThreadPoolExecutor, tmp_path: Path
) -> None:
    """A chat with tools renders the ``tool_use`` template and one without the ``default``, the
    same again once each was compiled and kept."""
    folder = tmp_path / "named"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {
            "name": "default",
            "template": "[plain]{% for m in messages %}{{ m.content }}{% endfor %}",
        },
        {"name": "tool_use", "template": "[tools {{ tools | length }}]{{ messages[0].content }}"},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = PromptTokenizer.load(str(folder), executor)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for _ in range(2):
        assert (await tokenizer.chat_prompt(CONVERSATION, tools)).text == "[tools 1]hello"
        assert (await tokenizer.chat_prompt(CONVERSATION)).text == "[plain]hello"


async def test_a_template_error_is_a_400(
    tiny_model_dir: Path, executor: ThreadPoolExecutor, tmp_path: Path
) -> None:
    template = tmp_path / "strict.jinja"
    template.write_text("{{ raise_exception('roles must alternate') }}")
    tokenizer = PromptTokenizer.load(
        str(tiny_model_dir), executor, chat_template_file=str(template)
    )
    with pytest.raises(InvalidRequestError, match="roles must alternate"):
        await tokenizer.chat_prompt(CONVERSATION)


async def test_counts_and_pieces(tiny_model_dir: Path, executor: ThreadPoolExecutor) -> None:
    tokenizer = PromptTokenizer.load(str(tiny_model_dir), executor)
    text = "the model token"
    pieces = await tokenizer.pieces(text)
    assert "".join(pieces) == text
    assert await tokenizer.count(text) == len(pieces)
    assert (await tokenizer.text_prompt(text)).token_count == len(pieces)


class CountingExecutor(ThreadPoolExecutor):
    """An executor that counts the work handed to it."""

    def __init__(self) -> None:
        super().__init__(1)
        self.submitted = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(*args, **kwargs)


async def test_short_inputs_stay_on_the_loop_and_long_ones_go_to_the_executor(
    tiny_model_dir: Path,
) -> None:
    with CountingExecutor() as pool:
        tokenizer = PromptTokenizer.load(str(tiny_model_dir), pool)
        short = await tokenizer.text_prompt("a short prompt")
        await tokenizer.chat_prompt(CONVERSATION)
        assert pool.submitted == 0
        long_text = "word " * (INLINE_CHARS // 5 + 1)
        long = await tokenizer.text_prompt(long_text)
        await tokenizer.chat_prompt([{"role": "user", "content": long_text}])
        await tokenizer.count(long_text)
        assert pool.submitted == 3
    # Either way the answer is the same tokenization.
    assert short.ids == tuple(
        tokenizer._tokenizer.encode("a short prompt", add_special_tokens=True)
    )
    encoded = tokenizer._tokenizer.encode(long_text, add_special_tokens=True)
    assert long.ids == tuple(encoded)


async def test_a_batch_of_short_prompts_is_one_job_off_the_loop(tiny_model_dir: Path) -> None:
    """Each short prompt alone stays on the loop; thousands of them together do not."""
    texts = [f"prompt {i}" for i in range(2000)]
    with CountingExecutor() as pool:
        tokenizer = PromptTokenizer.load(str(tiny_model_dir), pool)
        few = await tokenizer.text_prompts(texts[:3])
        assert pool.submitted == 0
        batch = await tokenizer.text_prompts(texts)
        assert pool.submitted == 1
        ids = await tokenizer.token_prompts(
            [(list(p.ids), f"prompt[{i}]") for i, p in enumerate(batch)]
        )
        assert pool.submitted == 2
    assert [p.ids for p in few] == [p.ids for p in batch[:3]]
    assert [p.text for p in batch] == texts
    assert [p.token_count for p in ids] == [p.token_count for p in batch]
