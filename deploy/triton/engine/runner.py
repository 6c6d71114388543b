"""Loads a Hugging Face causal LM and runs its prefill and batched decode forward passes."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from transformers import AutoModelForCausalLM
from transformers.cache_utils import Cache
from transformers.utils import logging as hf_logging

from deploy.triton.engine import packed
from deploy.triton.engine.kvcache import KVLayout, PagedView
from deploy.triton.engine.lora import LoadedLora, LoraContext, LoraTargets, install
from deploy.triton.engine.types import EngineConfig, EngineError, TokenIds

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}
_DEFAULT_CPU_THREADS = 4


def resolve_device(name: str) -> torch.device:
    """The device named by `torch_device`: "auto" is CUDA when available, else the CPU; a CUDA
    device on a machine without one is refused with the reason."""
    key = name.strip().lower()
    if key == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(key)
    except RuntimeError as exc:
        raise EngineError(f"torch_device {name!r} is not a torch device: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EngineError(
            f"torch_device {name!r} asks for CUDA, but this machine's torch has no CUDA device "
            f"(torch {torch.__version__}); use device: auto or cpu"
        )
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype named by `torch_dtype`; "auto" is float32 on CPU, bfloat16 (or float16) on CUDA."""
    key = name.strip().lower()
    if key == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if key not in _DTYPES:
        raise EngineError(f"torch_dtype {name!r} is not one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[key]


def configure_threads(device: torch.device, num_threads: int | None) -> int:
    """Bound torch's CPU thread pool; returns the thread count.

    torch defaults to one thread per core, which inside a sidecar competes with tritonserver,
    the other stub processes and the client: intra-op barriers then stall on descheduled
    threads (a 10x slowdown was measured on 2 cores). The default takes half the cores, at
    most 4, and 1 when the model runs on a GPU.
    """
    if num_threads is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        limit = _DEFAULT_CPU_THREADS if device.type == "cpu" else 1
        num_threads = max(1, min(limit, cores // 2))
    torch.set_num_threads(num_threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        logger.debug("torch inter-op pool already started; left as is")
    return num_threads


def load_language_model(path: str, dtype: torch.dtype) -> Any:
    """The causal LM of a checkpoint; of a Llava-style one (a ``vision_config`` beside its
    ``text_config``), the whole model without its vision tower and projector: the engine feeds
    it embeddings, and the ``multimodal_encoders`` model computes the image features."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(path)
    if getattr(config, "vision_config", None) is None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype)
    inner = getattr(model, "model", model)
    for name in ("vision_tower", "multi_modal_projector"):
        if isinstance(getattr(inner, name, None), torch.nn.Module):
            setattr(inner, name, torch.nn.Identity())
    return model


def _token_ids(value: Any) -> TokenIds:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


class ModelRunner:
    """Forward passes of one causal LM: single-sequence prefill and batched one-token decode."""

    def __init__(self, model: Any, device: torch.device) -> None:
        self.model = model
        self.device = device
        text_config = model.config.get_text_config()
        self.vocab_size = int(text_config.vocab_size)
        max_positions = getattr(text_config, "max_position_embeddings", None)
        self.max_positions: int | None = int(max_positions) if max_positions else None
        generation = getattr(model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None)
        self.default_end_ids = _token_ids(eos if eos is not None else text_config.eos_token_id)
        self.suppress_tokens = _token_ids(getattr(generation, "suppress_tokens", None))
        self.begin_suppress_tokens = _token_ids(getattr(generation, "begin_suppress_tokens", None))
        forward = inspect.signature(model.forward).parameters
        self._keep_last_logits = "logits_to_keep" in forward
        # transformers 5.24 renamed the forward's KV cache argument (the old name warns).
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"
        self.lora_targets = LoraTargets.of(model, device)
        self._lora = LoraContext()
        self._lora_installed = False

    @classmethod
    def load(cls, config: EngineConfig) -> ModelRunner:
        """Load `config.model_path` (local folder or hub id) onto the configured device."""
        device = resolve_device(config.device)
        threads = configure_threads(device, config.num_threads)
        dtype = resolve_dtype(config.dtype, device)
        hf_logging.disable_progress_bar()
        try:
            model = load_language_model(config.model_path, dtype)
        except (OSError, ValueError) as exc:
            raise OSError(f"cannot load model {config.model_path!r}: {exc}") from exc
        model = model.to(device).eval()
        if device.type == "cuda":
            # cuDNN attention rebuilds its graph whenever the KV length changes, i.e. on every
            # decode step (15 ms of CPU each, measured on an H200); flash/efficient kernels don't.
            torch.backends.cuda.enable_cudnn_sdp(False)
        logger.info(
            "loaded %s on %s as %s (%d CPU threads)",
            config.model_path,
            device,
            model.dtype,
            threads,
        )
        return cls(model, device)

    def kv_layout(self) -> KVLayout:
        """What the model caches per token, seen by running one token through it."""
        return KVLayout.probe(self.model, self.device, self._cache_arg)

    def prefill(
        self,
        tokens: Sequence[int],
        view: PagedView,
        *,
        all_logits: bool = False,
        adapter: LoadedLora | None = None,
        prompt_table: npt.NDArray[Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run a prompt's ``tokens`` (all of it or a chunk) on top of what ``view`` already
        holds (through ``adapter``, if any); returns the next-token logits [vocab] (float32)
        and, with ``all_logits``, the logits of every position [len(tokens), vocab]. Ids from
        ``vocab_size`` up stand for rows of ``prompt_table`` (TensorRT-LLM's prompt table)."""
        embeds = None
        if prompt_table is not None and any(token >= self.vocab_size for token in tokens):
            embeds = self._embed(tokens, prompt_table)
        logits = self._forward(
            [list(tokens)], view, [adapter], last_only=not all_logits, embeds=embeds
        )[0]
        return logits[-1], logits if all_logits else None

    def _embed(self, tokens: Sequence[int], prompt_table: npt.NDArray[Any]) -> torch.Tensor:
        """Input embeddings [1, len(tokens), hidden]: the embedding layer's rows for vocabulary
        ids, the prompt table's row ``id - vocab_size`` for the others."""
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.device)
        table = torch.from_numpy(np.ascontiguousarray(prompt_table)).to(self.device)
        placeholder = ids >= self.vocab_size
        with torch.inference_mode():
            embeds = self.model.get_input_embeddings()(ids.clamp(max=self.vocab_size - 1))
            embeds[placeholder] = table[ids[placeholder] - self.vocab_size].to(embeds.dtype)
        return embeds.unsqueeze(0)

    def decode(
        self,
        tokens: Sequence[int],
        view: PagedView,
        adapters: Sequence[LoadedLora | None] = (),
    ) -> torch.Tensor:
        """Feed one token per row, each row through its adapter (if any); returns next-token
        logits [rows, vocab] (float32)."""
        return self._forward([[token] for token in tokens], view, adapters, last_only=True)[
            :, -1, :
        ]

    def forward_packed(
        self, tokens: Sequence[int], view: Cache, positions: torch.Tensor, keep: torch.Tensor
    ) -> torch.Tensor:
        """Run ``tokens`` packed in one row through packed attention (``packed.PackedView`` is
        ``view``; its plan active); returns the logits of positions ``keep`` [len(keep), vocab]
        (float32)."""
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        extra: dict[str, Any] = {self._cache_arg: view, "input_ids": ids}
        if self._keep_last_logits:
            extra["logits_to_keep"] = keep
        self._use_adapters([None])
        config = self.model.config
        previous = config._attn_implementation
        config._attn_implementation = packed.ATTENTION
        try:
            with torch.inference_mode():
                out = self.model(position_ids=positions, use_cache=True, **extra)
        finally:
            config._attn_implementation = previous
        logits = out.logits[0]
        return (logits if self._keep_last_logits else logits.index_select(0, keep)).float()

    def _forward(
        self,
        rows: list[list[int]],
        view: PagedView,
        adapters: Sequence[LoadedLora | None],
        *,
        last_only: bool,
        embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        extra: dict[str, Any] = {self._cache_arg: view}
        if embeds is None:
            extra["input_ids"] = torch.tensor(rows, dtype=torch.long, device=self.device)
        else:
            extra["inputs_embeds"] = embeds
        if last_only and self._keep_last_logits:
            extra["logits_to_keep"] = 1
        self._use_adapters(adapters)
        with torch.inference_mode():
            out = self.model(
                attention_mask=view.attention_mask,
                position_ids=view.positions,
                use_cache=True,
                **extra,
            )
        return out.logits.float()

    def _use_adapters(self, adapters: Sequence[LoadedLora | None]) -> None:
        if not self._lora_installed:
            if not any(adapters):
                return
            install(self.model, self._lora)
            self._lora_installed = True
        self._lora.use(list(adapters))
