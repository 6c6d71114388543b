"""What the tiny test models share: their tokenizer (a byte-level BPE trained on a fixed corpus,
with ChatML special tokens and template, and the helpers that keep its folder loadable
everywhere) and the shape of their Llama language model."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

CHATML_TEMPLATE = (
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content -%}{%- for part in content -%}"
    "{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{{- render_content(messages[0].content) + '\\n\\n' -}}"
    "{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Function signatures:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    '{{- \'\\n</tools>\\n\\nFor each call return <tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (tools and loop.first and message.role == 'system') -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) -}}"
    "{%- for call in message.tool_calls | default([], true) -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- set args = fn.arguments if fn.arguments is string else (fn.arguments | tojson) -%}"
    '{{- \'<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' -}}'
    "{{- args + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_WORD_TEXT = (
    "the a an of to in is it that for on with as was by at be this are from or have not but "
    "which one all were when we there can out if about more will up so what some would time "
    "into has two like them see other than then now look only come its over think also back "
    "after use how our work first well way even new want because any these give day most us "
    "model token server request response stream batch engine tensor gateway python triton "
    "cache queue thread value error string number list return yield class import def self "
    "data file path name text input output length window prefix offset state chunk model "
    "paris france capital city river bridge music light water green blue small large quick "
    "brown fox jumps lazy dog morning evening house garden window door table chair paper café "
    "naïve résumé über"
)
_CODE_LINES = (
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * 2)\n",
    "class Node:\n    def __init__(self, value):\n        self.value = value\n",
    "if x is None:\n    raise ValueError('missing value')\n",
    'result = {"name": "tiny", "size": 64, "layers": [1, 2]}\n',
    "import os\nimport sys\npath = os.path.join(root, name)\n",
)


def tiny_corpus() -> list[str]:
    """A fixed training corpus, identical on every machine and Python version."""
    rng = random.Random(1234)
    vocabulary = _WORD_TEXT.split()
    lines: list[str] = []
    for _ in range(1500):
        count = 4 + int(rng.random() * 12)
        words = [vocabulary[int(rng.random() * len(vocabulary))] for _ in range(count)]
        lines.append(" ".join(words).capitalize() + ".")
    lines.extend(_CODE_LINES * 20)
    return lines


def train_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        model_max_length=4096,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def unprintable_token_ids(tokenizer: Any) -> list[int]:
    """Ids of special tokens and of tokens whose bytes are not all printable ASCII."""
    byte_of = {ch: b for b, ch in enumerate(_byte_level_chars())}
    vocab: dict[str, int] = tokenizer.get_vocab()
    suppressed = []
    for piece, token_id in vocab.items():
        if piece in SPECIAL_TOKENS or any(not 0x20 <= byte_of[ch] <= 0x7E for ch in piece):
            suppressed.append(token_id)
    return sorted(suppressed)


def _byte_level_chars() -> list[str]:
    """The 256 characters GPT-2's byte-level alphabet uses, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars: list[str] = []
    shift = 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + shift))
            shift += 1
    return chars


def portable_tokenizer_config(path: Path, *, model_max_length: int) -> None:
    """Name the tokenizer class and inline the template so transformers 4.x loads the folder too."""
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["model_max_length"] = model_max_length
    for loader_only in ("is_local", "local_files_only"):
        config.pop(loader_only, None)
    template_file = path / "chat_template.jinja"
    if template_file.is_file():
        config["chat_template"] = template_file.read_text()
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def tiny_llama_config(vocab_size: int, eos_id: int, pad_id: int) -> Any:
    """The tiny Llama language model's config: two layers of width 64."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
